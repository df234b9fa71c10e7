"""One `llm` model instance: everything a stub of model `llm` runs, built in order and closed in order.

`LLMInstance(args, model_config)` builds, from Triton's initialize() arguments: the metrics thread,
the engine (LLMEngine), the engine loop (its own thread), the response-sender ledger, the drain, the
control bus with the `stop` requests and the runtime LoRA loads it carries (llm/lora_admin.py; the
adapters it starts with: llm/lora_start.py), the responder thread, the engine channel that serves
the ensemble's requests, the stall watchdog and the opt-in memory trace. `submit` is the direct
(vLLM-contract) request path; `close()` ends them all in the one order that lets requests in flight
end with an error instead of never. The model file keeps only what speaks pb_utils to Triton.
"""

from __future__ import annotations

import gc
import logging
import time
import uuid

from paddle_llm_engine import EngineConfig, EngineLoop, LLMEngine
from paddle_llm_triton.config_params import engine_config_from_triton, serving_options
from paddle_llm_triton.engine_channel.control_bus import ControlBus
from paddle_llm_triton.engine_channel.server import ChannelServer
from paddle_llm_triton.lifecycle.drain import Drain
from paddle_llm_triton.lifecycle.fault_injection import install_step_fault
from paddle_llm_triton.lifecycle.health import StallWatchdog
from paddle_llm_triton.lifecycle.instances import instance_names
from paddle_llm_triton.lifecycle.memory_trace import start_from_env as start_memory_trace
from paddle_llm_triton.lifecycle.restarts import notify_failure, restart_count
from paddle_llm_triton.lifecycle.senders import SenderLedger
from paddle_llm_triton.llm.ensemble_steps import EnsembleStepHandler
from paddle_llm_triton.llm.lora_admin import BUS_TYPE as LORA_BUS_TYPE, LoraAdmin
from paddle_llm_triton.llm.lora_start import add_start_adapters, explain_start_error, runtime_settings
from paddle_llm_triton.llm.lora_tasks import LoraTasks
from paddle_llm_triton.llm.responder import Responder
from paddle_llm_triton.llm.stop_requests import StopRequests
from paddle_llm_triton.llm.vllm_request import VllmRequest
from paddle_llm_triton.metrics import LLMMetrics

log = logging.getLogger("llm")


class LLMInstance:
    """The engine of one `llm` instance and its collaborators.

    args: Triton's initialize() dict (model_name, model_version, model_instance_name, ...);
    model_config: its parsed `model_config` JSON. Raises what EngineConfig / LLMEngine raise for a bad
    configuration or model (ValueError, FileNotFoundError, ...): the model then fails to load."""

    def __init__(self, args: dict, model_config: dict):
        cfg: EngineConfig = engine_config_from_triton(model_config, args)
        opts = serving_options(model_config)
        self.name = args["model_instance_name"]
        self.model_name = args["model_name"]
        lora_runtime = runtime_settings(cfg, opts)  # None: runtime LoRA updating off (checked before the engine)
        lora_from_file = add_start_adapters(cfg, args)  # multi_lora.json beside the model (enable_lora 1)
        log.info("llm instance %s: %s", self.name, cfg)
        self.metrics = LLMMetrics({"model": self.model_name, "version": str(args["model_version"]),
                                   "instance": self.name}, restarts_before=restart_count(self.model_name),
                                  names=opts.metrics_names)
        try:
            self.engine = LLMEngine(cfg)
        except ValueError as e:  # an adapter of multi_lora.json: the file is named too
            raise explain_start_error(e, lora_from_file) from None
        self._report_engine_config()
        install_step_fault(self.engine, opts.fault_inject_after_steps)  # tests only; 0 = off
        self.default_max_tokens = opts.default_max_tokens  # 0: max_model_len - prompt tokens
        self.tokenizer = self.engine.tokenizer
        self.loop = EngineLoop(self.engine, on_state=self.metrics.on_state, on_failure=self._on_engine_failure)
        self.senders = SenderLedger()  # every Triton response sender until its FINAL (a forgotten one pins the model)
        self.drain = Drain(self.model_name, self.name, self._requests_open, self.loop.fail_all,
                           open_responses=self.senders.open_by_kind)
        self.control = ControlBus(self.model_name, self.name, {}, instance_names(model_config, self.model_name))
        self.stops = StopRequests(self.loop.abort, self.control.publish)
        self.lora_admin = LoraAdmin(self.engine, lora_runtime, self.control)  # runtime loads, on every instance
        self.control.handlers.update(stop=self.stops.on_control, drain=self.drain.on_drain, status=self.drain.status,
                                     **{LORA_BUS_TYPE: self.lora_admin.on_bus})
        self.responder = Responder(abort=self.loop.abort, decode_token=self._decode_token,
                                   on_finished=self._on_finished, poll_s=opts.cancellation_check_period_ms / 1000.0,
                                   coalesce=opts.coalesce_stream_responses, stream_interval=opts.stream_interval)
        # TensorRT-LLM's LoRA task ids of the ensemble's requests: a cache directory of this instance's own
        self.lora_tasks = LoraTasks(self.engine, opts.lora_cache_host_memory_bytes) if cfg.enable_lora else None
        self.channel = ChannelServer(self.model_name, self.name, EnsembleStepHandler(
            self.loop, self.metrics.on_output, self.default_max_tokens, cfg.max_model_len, self.name,
            on_rejected=self.metrics.on_rejected, drain=self.drain, stream_interval=opts.stream_interval,
            lora_tasks=self.lora_tasks))
        self.watchdog = StallWatchdog({"the engine step": self._step_started_at,
                                       "a response send to Triton": self._send_started},
                                      self.loop.declare_failed, opts.max_step_seconds,
                                      liveness=self.engine.executor.dead_worker)
        self.memory_trace = start_memory_trace(self.name)  # diagnostics, off unless asked for
        self._announce()

    def _report_engine_config(self) -> None:
        bm = self.engine.block_manager  # vllm: names; prefix-cache counters read on the metrics thread
        self.metrics.on_engine_config(self.engine.config.max_model_len, bm.block_size, bm.num_blocks,
                                      bm.enable_prefix_caching, self.engine.info()["kv_cache_dtype"],
                                      prefix_counts=lambda: (bm.prefix_query_tokens, bm.prefix_hit_tokens))

    def _announce(self) -> None:
        self.metrics.on_state(self.engine.stats())
        info = self.engine.info()
        self.metrics.on_engine_info(info)
        log.info("llm instance %s: serving on %s (%s)", self.name, info["device"],
                 ", ".join(f"{k} {v}" for k, v in info.items() if k != "device"))

    @property
    def healthy(self) -> bool:
        """True while the engine serves; False once it failed (llm_engine_healthy says the same)."""
        return self.loop.healthy

    # -- callbacks of the collaborators ------------------------------------------------------------
    def _requests_open(self) -> int:
        """What a drain waits for: requests in the engine, or senders still without their FINAL."""
        return max(self.loop.num_in_flight, self.senders.open)

    def _step_started_at(self):
        return self.loop.step_started_at

    def _send_started(self):
        return self.responder.send_started

    def _on_finished(self, out) -> None:
        self.stops.remove(out.request_id)

    def _on_engine_failure(self, reason: str) -> None:
        """Engine thread (or the stall watchdog's), once: the requests in flight already got an error."""
        self.metrics.on_engine_failed()
        notify_failure(self.model_name, self.name, reason)  # the launcher's supervisor reloads us
        log.error("llm instance %s: engine failed (%s); every new request now fails at once with INTERNAL and "
                  "llm_engine_healthy is 0: the launcher's supervisor reloads the model (plain tritonserver: "
                  "Triton 2.51 keeps /v2/models/llm/ready at 200; restart the server)", self.name, reason)

    def _on_output(self, out) -> None:
        """Engine-thread callback: both consumers only enqueue."""
        self.metrics.on_output(out)
        self.responder.push(out)

    def _decode_token(self, token_id: int, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=skip_special_tokens)

    # -- requests ----------------------------------------------------------------------------------
    def submit(self, request, sender) -> None:
        """A direct vLLM-contract request: parse, register its responses, submit to the engine.
        Raises DrainingError (draining), EngineDeadError (the engine failed), InvalidRequestError (bad
        input) or EngineBusyError (waiting queue full); then nothing is registered and no response sent."""
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

    def stop(self, triton_id: str) -> int:
        """TensorRT-LLM `stop`: abort the requests in flight under this Triton request id here and tell
        the sibling instances; returns how many were aborted here."""
        n = self.stops.stop(triton_id)
        log.info("stop request for id %r: %d request(s) aborted on %s (siblings notified)", triton_id, n, self.name)
        return n

    # -- the end -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop taking work, end the requests in flight with an error, stop every thread and process
        (the tensor-parallel workers), in this order; each step that takes over 1 s is logged."""
        t0 = time.monotonic()
        steps = [("watchdog", self.watchdog.close), ("engine channel", self.channel.close),
                 # requests still in flight (an unload, not a drain) end with an error instead of never
                 ("engine loop", lambda: self.loop.shutdown(
                     message=f"llm instance {self.name} was unloaded before the request finished")),
                 ("engine", self.engine.close),  # tensor parallel: stops the worker processes
                 ("LoRA task cache", self.lora_tasks.close if self.lora_tasks is not None else lambda: None),
                 ("control bus", self.control.close), ("responder", self.responder.shutdown),
                 ("metrics", self.metrics.shutdown)]
        if self.memory_trace is not None:
            self.memory_trace.close()
        for name, close in steps:
            t = time.monotonic()
            close()
            if time.monotonic() - t > 1.0:  # Triton waits for this process without a bound: say what took long
                log.warning("llm instance %s: finalize: %s took %.1f s", self.name, name, time.monotonic() - t)
        # Any cycle still holding a pb_utils object is freed now, while the stub can take its clean-up;
        # at the stub's exit that clean-up would reach for a stub already destroyed.
        gc.collect()
        log.info("llm instance %s: finalized in %.1f s", self.name, time.monotonic() - t0)
