"""Triton decoupled model `llm`: hosts one Paddle LLM engine per model instance.

Contract: Triton's vLLM backend (text_input, stream, sampling_parameters JSON, the return_* flags;
parsed and answered by paddle_llm_triton/llm/vllm_request.py) plus TensorRT-LLM's `stop`: a request
with stop = true aborts the requests in flight under the same Triton request id, on every instance
(paddle_llm_triton/llm/stop_requests.py). execute() only parses and enqueues; the engine runs on its own
thread and a responder thread sends the responses. The `ensemble` model's requests do not come
through Triton: they arrive on this instance's engine channel (paddle_llm_triton/engine_channel/,
served by paddle_llm_triton/llm/ensemble_steps.py), which never calls pb_utils.
"""

import gc
import json
import logging
import time
import uuid

import triton_python_backend_utils as pb_utils

import numpy as np

from paddle_llm_engine import EngineBusyError, EngineConfig, EngineDeadError, EngineLoop, InvalidRequestError, LLMEngine
from paddle_llm_triton import tensors as T
from paddle_llm_triton.config_params import engine_config_from_triton, serving_options
from paddle_llm_triton.engine_channel.control_bus import ControlBus
from paddle_llm_triton.lifecycle.drain import Drain, DrainingError
from paddle_llm_triton.engine_channel.server import ChannelServer
from paddle_llm_triton.llm.ensemble_steps import EnsembleStepHandler
from paddle_llm_triton.lifecycle.fault_injection import install_step_fault
from paddle_llm_triton.lifecycle.health import StallWatchdog
from paddle_llm_triton.lifecycle.instances import instance_names
from paddle_llm_triton.lifecycle.memory_trace import start_from_env as start_memory_trace
from paddle_llm_triton.metrics import LLMMetrics
from paddle_llm_triton.llm.responder import Responder
from paddle_llm_triton.lifecycle.restarts import notify_failure, restart_count
from paddle_llm_triton.lifecycle.senders import SenderLedger
from paddle_llm_triton.llm.stop_requests import StopRequests
from paddle_llm_triton.llm.vllm_request import VllmRequest

log = logging.getLogger("llm")


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("model `llm` must use the decoupled transaction policy")
        cfg: EngineConfig = engine_config_from_triton(model_config, args)
        opts = serving_options(model_config)
        self.instance = args["model_instance_name"]
        self.model_name = args["model_name"]
        log.info("llm instance %s: %s", self.instance, cfg)
        self.metrics = LLMMetrics({"model": args["model_name"], "version": str(args["model_version"]),
                                   "instance": self.instance}, restarts_before=restart_count(args["model_name"]),
                                  names=opts.metrics_names)
        self.engine = LLMEngine(cfg)
        bm = self.engine.block_manager  # vllm: names; prefix-cache counters read on the metrics thread
        self.metrics.on_engine_config(self.engine.config.max_model_len, bm.block_size, bm.num_blocks,
                                      bm.enable_prefix_caching, self.engine.info()["kv_cache_dtype"],
                                      prefix_counts=lambda: (bm.prefix_query_tokens, bm.prefix_hit_tokens))
        install_step_fault(self.engine, opts.fault_inject_after_steps)  # tests only; 0 = off
        self.default_max_tokens = opts.default_max_tokens  # 0: max_model_len - prompt tokens
        self.tokenizer = self.engine.tokenizer
        self.loop = EngineLoop(self.engine, on_state=self.metrics.on_state, on_failure=self._on_engine_failure)
        self.senders = SenderLedger()  # every Triton response sender until its FINAL (a forgotten one pins the model)
        self.drain = Drain(args["model_name"], self.instance, lambda: max(self.loop.num_in_flight, self.senders.open),
                           self.loop.fail_all, open_responses=self.senders.open_by_kind)
        self.control = ControlBus(args["model_name"], self.instance, {}, instance_names(model_config, args["model_name"]))
        self.stops = StopRequests(self.loop.abort, self.control.publish)
        self.control.handlers.update(stop=self.stops.on_control, drain=self.drain.on_drain, status=self.drain.status)
        self.responder = Responder(abort=self.loop.abort, decode_token=self._decode_token,
                                   on_finished=lambda out: self.stops.remove(out.request_id),
                                   poll_s=opts.cancellation_check_period_ms / 1000.0,
                                   coalesce=opts.coalesce_stream_responses, stream_interval=opts.stream_interval)
        self.channel = ChannelServer(args["model_name"], self.instance, EnsembleStepHandler(
            self.loop, self.metrics.on_output, self.default_max_tokens, cfg.max_model_len, self.instance,
            on_rejected=self.metrics.on_rejected, drain=self.drain, stream_interval=opts.stream_interval))
        self.watchdog = StallWatchdog({"the engine step": lambda: self.loop.step_started_at,
                                       "a response send to Triton": lambda: self.responder.send_started},
                                      self.loop.declare_failed, opts.max_step_seconds,
                                      liveness=self.engine.executor.dead_worker)
        self.memory_trace = start_memory_trace(self.instance)  # diagnostics, off unless asked for
        self.metrics.on_state(self.engine.stats())
        info = self.engine.info()
        self.metrics.on_engine_info(info)
        log.info("llm instance %s: serving on %s (%s)", self.instance, info["device"],
                 ", ".join(f"{k} {v}" for k, v in info.items() if k != "device"))

    def is_ready(self) -> bool:
        """Model readiness (Triton >= 2.67 calls this on /v2/models/llm/ready; 2.51 never does): ready
        while the engine serves, not ready once it failed (the llm_engine_healthy gauge says the same)."""
        loop = getattr(self, "loop", None)
        return loop is not None and loop.healthy

    def _on_engine_failure(self, reason: str):
        """Engine thread (or the stall watchdog's), once: the requests in flight already got an error."""
        self.metrics.on_engine_failed()
        notify_failure(self.model_name, self.instance, reason)  # the launcher's supervisor reloads us
        log.error("llm instance %s: engine failed (%s); every new request now fails at once with INTERNAL and "
                  "llm_engine_healthy is 0: the launcher's supervisor reloads the model (plain tritonserver: "
                  "Triton 2.51 keeps /v2/models/llm/ready at 200; restart the server)", self.instance, reason)

    def _on_output(self, out):
        """Engine-thread callback: both consumers only enqueue."""
        self.metrics.on_output(out)
        self.responder.push(out)

    def _decode_token(self, token_id: int, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=skip_special_tokens)

    def execute(self, requests):
        for request in requests:
            sender = self.senders.track(request.get_response_sender(), "llm")
            try:
                if T.get_bool(request, "stop"):
                    self._stop(request, sender)
                else:
                    self._submit(request, sender)
            except Exception as e:  # refused: one final error response, the instance keeps serving
                self._refuse(sender, e)
        return None

    def _refuse(self, sender, e: Exception):
        """Answer a refused request: bad input INVALID_ARG; draining (retry elsewhere) and a full
        waiting queue (nothing queued) UNAVAILABLE; a failed engine or anything unexpected INTERNAL."""
        E = pb_utils.TritonError
        if isinstance(e, InvalidRequestError):
            reason, text, code = "invalid", str(e), E.INVALID_ARG
        elif isinstance(e, (DrainingError, EngineBusyError)):
            reason, text, code = ("draining" if isinstance(e, DrainingError) else "queue_full"), str(e), E.UNAVAILABLE
        elif isinstance(e, EngineDeadError):  # fail fast, naming the original failure
            reason, text, code = "not_serving", f"llm instance {self.instance} is not serving: {e}", E.INTERNAL
        else:
            log.exception("request rejected")
            reason, text, code = "internal", f"{type(e).__name__}: {e}", E.INTERNAL
        self.metrics.on_rejected(reason)
        sender.send(pb_utils.InferenceResponse(error=E(text, code)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _stop(self, request, sender):
        """TensorRT-LLM `stop`: abort the requests in flight under this request's id; answer at once."""
        tid = request.request_id()
        if not tid:
            raise InvalidRequestError("stop", "a stop request needs the request id of the request to stop "
                                              "(send it with the same request id)")
        n = self.stops.stop(tid)
        log.info("stop request for id %r: %d request(s) aborted on %s (siblings notified)", tid, n, self.instance)
        sender.send(pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", np.array([b""], dtype=np.object_))]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _submit(self, request, sender):
        """A direct vLLM-contract request: parse, register its responses, submit to the engine."""
        self.drain.refuse_if_draining()
        self.loop.raise_if_dead()  # fail fast once the engine has failed
        req = VllmRequest.parse(request, self.tokenizer, self.engine.config.max_model_len, self.default_max_tokens)
        rid = uuid.uuid4().hex
        self.responder.register(rid, sender, req.options)
        self.stops.add(request.request_id(), rid)
        try:
            req.submit(self.loop, rid, self._on_output)
        except Exception:
            self.responder.discard(rid)
            self.stops.remove(rid)
            raise

    def finalize(self):
        t0 = time.monotonic()
        steps = [("watchdog", self.watchdog.close), ("engine channel", self.channel.close),
                 # requests still in flight (an unload, not a drain) end with an error instead of never
                 ("engine loop", lambda: self.loop.shutdown(
                     message=f"llm instance {self.instance} was unloaded before the request finished")),
                 ("engine", self.engine.close),  # tensor parallel: stops the worker processes
                 ("control bus", self.control.close), ("responder", self.responder.shutdown),
                 ("metrics", self.metrics.shutdown)]
        if self.memory_trace is not None:
            self.memory_trace.close()
        for name, close in steps:
            t = time.monotonic()
            close()
            if time.monotonic() - t > 1.0:  # Triton waits for this process without a bound: say what took long
                log.warning("llm instance %s: finalize: %s took %.1f s", self.instance, name, time.monotonic() - t)
        # Any cycle still holding a pb_utils object is freed now, while the stub can take its clean-up;
        # at the stub's exit that clean-up would reach for a stub already destroyed.
        gc.collect()
        log.info("llm instance %s: finalized in %.1f s", self.instance, time.monotonic() - t0)
