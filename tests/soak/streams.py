"""A gRPC bidirectional stream for the soak: timestamps every response on arrival (TTFT / ITL),
carries request ids (two requests on one stream for the TensorRT-LLM `stop` input), and ends in one
of the three ways clients end streams: stop_stream() after the final response, stop_stream(
cancel_requests=True), or closing the channel under the stream (a client that drops its socket)."""

from __future__ import annotations

import queue
import time

import tritonclient.grpc as grpcclient

from clients import is_final  # tests/support


class StreamTimeout(Exception):
    """No response arrived within the bound (seconds in the message)."""


class StreamBroken(Exception):
    """The stream ended before a request could be sent on it (the message says why)."""


class Stream:
    """One client and one open stream. Raises tritonclient's InferenceServerException when the
    server is unreachable; every read is bounded (`next`)."""

    def __init__(self, url: str):
        self._q: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        # tritonclient calls the callback with keyword arguments result= and error=
        self.client.start_stream(callback=self._on_response)
        self._closed = False

    def _on_response(self, result=None, error=None):
        self._q.put((time.monotonic(), result, error))

    def send(self, model: str, inputs, request_id: str = "") -> float:
        """Send one request; returns the send time. Raises StreamBroken with the stream's own error
        (e.g. the server is unreachable) when the stream cannot take it."""
        t = time.monotonic()
        try:
            self.client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)
        except Exception as e:  # noqa: BLE001 - tritonclient reports the cause through the callback
            try:
                _, _, detail = self._q.get(timeout=1.0)
            except queue.Empty:
                detail = None
            raise StreamBroken(str(detail) if detail is not None else str(e)) from None
        return t

    def next(self, timeout: float):
        """(arrival time, result, error) of the next response; raises StreamTimeout."""
        try:
            return self._q.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            raise StreamTimeout(f"no response within {timeout:.0f} s") from None

    def close(self) -> None:
        """Half-close after the request ended (the normal end of a client)."""
        self._end(lambda: self.client.stop_stream())

    def cancel(self) -> None:
        """stop_stream(cancel_requests=True): Triton cancels the requests in flight."""
        self._end(lambda: self.client.stop_stream(cancel_requests=True))

    def drop(self) -> None:
        """Close the channel under the open stream, as a client whose socket goes away."""
        self._end(lambda: self.client._channel.close())

    def _end(self, how) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            how()
        except Exception:  # noqa: BLE001 - a broken stream is being closed anyway
            pass
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass


def final(result) -> bool:
    """True when result is flagged triton_final_response."""
    return result is not None and is_final(result)
