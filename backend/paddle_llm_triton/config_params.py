"""EngineConfig (and the serving-only options) from the `parameters` of a Triton model's config.pbtxt.

Every EngineConfig field is a config parameter of the same name with EngineConfig's default
(an empty string_value also means the default). The one environment fallback: `model_dir` empty
in config.pbtxt -> PADDLE_LLM_MODEL_DIR, which the launcher sets from MODEL_DIR; a non-empty config
value always wins. Unknown parameter names are an error naming them. Deprecated names
(config.DEPRECATED_ALIASES: max_waiting_requests for max_num_waiting) are still accepted with a
warning; a config that sets both names is an error.

Serving-only parameters (not engine settings): ServingOptions; its docstring documents each (the
configuration reference, docs/reference/configuration.md, is generated from it and EngineConfig's).

Device id of an instance: gcu_device_ids when set; else the `device_id` parameter when set (all
instances on that id); else the instance ordinal (instance k on device k; on CPU the id is unused).
With tensor_parallel_size N > 1 that id is the instance's first device and its ranks take it and
the next N - 1; the default is then k * N (instance k on devices k*N .. k*N + N - 1).
Triton itself gives every KIND_CPU instance device id 0, so its model_instance_device_id is not used.

Multi-host tensor parallel (tp_hosts set): instance k's step channel listens on tp_port + k, so that
several instances of one model do not collide on one port (the remote ranks of instance k connect
to that port).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from paddle_llm_engine.config import DEPRECATED_ALIASES, EngineConfig
from paddle_llm_engine.kv_events import offset_port
from paddle_llm_triton.lifecycle.instances import instance_ordinal
from paddle_llm_triton.metrics.names import NAME_SETS, parse_name_sets

MODEL_DIR_ENV = "PADDLE_LLM_MODEL_DIR"
# the secret runtime LoRA updates must carry (llm/lora_admin.py): set by the launcher for tritonserver
# (so the llm stubs) and for the OpenAI frontend; never on a command line
LORA_ADMIN_KEY_ENV = "PADDLE_LLM_LORA_ADMIN_KEY"


@dataclass
class ServingOptions:
    """config.pbtxt parameters of the `llm` model that are not EngineConfig fields.

    This docstring is their documentation (docs/gen_config_reference.py renders it; a unit test
    fails when a field has no entry). One entry per field, "name: text", continuation lines indented.

    gcu_device_ids: device ids for the instances, e.g. "0;1;2;3": instance k (its position in
        instance_group, llm_0_k; lifecycle/instances.py) uses id k modulo the list length. "" (the default):
        device_id decides. Cannot be combined with device_id.
    default_max_tokens: max_tokens of a request that sends none (both models); 0 / empty (the
        default) = max_model_len - prompt tokens. Capped at what fits (max_model_len - prompt
        tokens), so a default never makes a request fail. 16 is vLLM's SamplingParams default
        (strict vLLM-backend compatibility: its CI expects "length" after 16 tokens).
    max_step_seconds: an engine step, or one response send to Triton, that has not returned after
        this many seconds marks the instance failed (lifecycle/health.py) and the supervisor replaces it
        (docs/operations/reliability.md); 0 turns the watchdog off. Default 120: far above any step
        of a healthy engine (a whole 2048-token prefill of SmolLM2 takes ~1 s on 2 CPU cores), low
        enough that a stuck instance is replaced within minutes.
    fault_inject_after_steps: TESTS ONLY. N > 0 makes every engine step after the N-th raise
        (lifecycle/fault_injection.py; docs/operations/engine_failure.md); 0 (the default) is off and nothing
        is installed. Never set it in production.
    metrics_names: which metric name sets the instance exposes on :8002, "llm,vllm" (the default:
        both), "llm" (the llm_* families) or "vllm" (vLLM's vllm:* names); anything else is an error
        at load (metrics/names.py parse_name_sets; docs/operations/metrics.md).
    coalesce_stream_responses: "true" (the default) lets a streamed response that fell behind carry
        the tokens of several engine steps in one response (llm/responder.py); "false" sends one
        response per engine output always. The ensemble model has the same parameter
        (docs/contracts/llm.md, "Streaming under load").
    stream_interval: tokens per streamed response after a sequence's first (vLLM's and SGLang's
        `stream_interval`), for direct `llm` streams and the ensemble's alike; 1 (the default)
        streams every token; N > 1 sends one response per N tokens (the first token and the last
        response are never held), dividing the per-response cost of Triton, gRPC/SSE and the client
        by N (docs/contracts/llm.md, "Streaming under load"). Must be an integer >= 1, else the load
        fails naming it.
    cancellation_check_period_ms: how often `llm`'s response thread asks Triton whether each direct
        request in flight was cancelled (the TensorRT-LLM backend's parameter of that name; default
        100). Each ask is an IPC round trip per request, so at 8-32 streams the sweep's wake-ups of
        tritonserver cost several percent of the step time; a longer period trades that for a later
        abort (KV blocks freed up to one period after the client left). Must be an integer >= 1.
    lora_cache_host_memory_bytes: with enable_lora 1, the bytes of LoRA weights that `ensemble`
        requests sent as TensorRT-LLM's lora_task_id + lora_weights + lora_config an instance keeps
        cached by task id (TensorRT-LLM's parameter of that name; default 1 GiB, as there). Past it
        the least recently used tasks no request is running with are unloaded; a single adapter above
        it is refused (docs/features/lora.md). Must be an integer >= 1.
    allow_runtime_lora_updating: 1 lets adapters be loaded and unloaded while the server runs (vLLM's
        VLLM_ALLOW_RUNTIME_LORA_UPDATING; the OpenAI API's /v1/load_lora_adapter and
        /v1/unload_lora_adapter), on every instance of `llm` at once; only folders under lora_root,
        and only callers that send the server's PADDLE_LLM_LORA_ADMIN_KEY (the launcher makes one per
        start and gives it to the OpenAI frontend). 0 (the default): the adapters are those of
        lora_modules and multi_lora.json, fixed at start. Needs enable_lora 1 and lora_root
        (docs/features/lora.md, docs/security.md).
    lora_root: the folder runtime-loaded adapters must lie under (an absolute path; symbolic links are
        resolved, and a lora_path that resolves outside it is refused naming lora_path; a relative
        lora_path is taken under it). Required with allow_runtime_lora_updating 1; "" (the default)
        otherwise. Adapters loaded at start (lora_modules, multi_lora.json) may lie anywhere.
    """

    gcu_device_ids: list[int] = dataclasses.field(default_factory=list)
    default_max_tokens: int = 0
    max_step_seconds: float = 120.0
    fault_inject_after_steps: int = 0
    metrics_names: tuple[str, ...] = NAME_SETS
    coalesce_stream_responses: bool = True
    stream_interval: int = 1
    cancellation_check_period_ms: int = 100
    lora_cache_host_memory_bytes: int = 1 << 30
    allow_runtime_lora_updating: bool = False
    lora_root: str = ""


SERVING_KEYS = {f.name for f in dataclasses.fields(ServingOptions)}


def engine_fields() -> dict[str, str]:
    """EngineConfig field name -> its type name ("int", "str", "float", "bool")."""
    out = {}
    for f in dataclasses.fields(EngineConfig):
        t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        out[f.name] = t
    return out


def _raw(model_config: dict) -> dict[str, str]:
    return {k: (v or {}).get("string_value", "") for k, v in (model_config.get("parameters") or {}).items()}


def _convert(name: str, type_name: str, value: str):
    v = value.strip()
    try:
        if type_name == "int":
            return int(v)
        if type_name == "float":
            return float(v)
        if type_name == "bool":
            low = v.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(v)
    except ValueError:
        raise ValueError(f"config.pbtxt parameter {name} must be {'an integer' if type_name == 'int' else 'a ' + type_name}, "
                         f"got {value!r}") from None
    return value


def check_known(model_config: dict) -> dict[str, str]:
    """The raw parameters; raises ValueError naming unknown ones and listing the accepted names."""
    raw = _raw(model_config)
    known = set(engine_fields()) | SERVING_KEYS
    unknown = sorted(set(raw) - known - set(DEPRECATED_ALIASES))
    if unknown:
        raise ValueError(f"unknown parameters in config.pbtxt: {unknown} (accepted: {', '.join(sorted(known))})")
    for old, new in DEPRECATED_ALIASES.items():
        if raw.get(old, "").strip() and raw.get(new, "").strip():
            raise ValueError(f"config.pbtxt sets both {new} and its deprecated alias {old}: set {new} only")
    return raw


def serving_options(model_config: dict) -> ServingOptions:
    raw = check_known(model_config)
    opts = ServingOptions()
    ids = raw.get("gcu_device_ids", "")
    try:
        opts.gcu_device_ids = [int(x) for x in ids.replace(",", ";").split(";") if x.strip()]
    except ValueError:
        raise ValueError(f"config.pbtxt parameter gcu_device_ids must be ids separated by ';', got {ids!r}") from None
    _set_at_least(opts, raw, "default_max_tokens", "int", 0, " (0 = max_model_len - prompt)")
    _set_at_least(opts, raw, "max_step_seconds", "float", 0, " (0 = watchdog off)")
    names = raw.get("metrics_names", "")
    if names.strip():
        opts.metrics_names = parse_name_sets(names)
    coalesce = raw.get("coalesce_stream_responses", "").strip()
    if coalesce:
        opts.coalesce_stream_responses = _convert("coalesce_stream_responses", "bool", coalesce)
    _set_at_least(opts, raw, "stream_interval", "int", 1)
    _set_at_least(opts, raw, "cancellation_check_period_ms", "int", 1)
    _set_at_least(opts, raw, "fault_inject_after_steps", "int", 0)
    _set_at_least(opts, raw, "lora_cache_host_memory_bytes", "int", 1)
    runtime = raw.get("allow_runtime_lora_updating", "").strip()
    if runtime:
        opts.allow_runtime_lora_updating = _convert("allow_runtime_lora_updating", "bool", runtime)
    opts.lora_root = raw.get("lora_root", "").strip()
    return opts


def _set_at_least(opts: ServingOptions, raw: dict, name: str, type_name: str, minimum: float, hint: str = "") -> None:
    """opts.<name> from a non-empty config value of `type_name` ("int" / "float"); ValueError naming
    the parameter when it is malformed or below `minimum`."""
    text = raw.get(name, "").strip()
    if not text:
        return
    value = _convert(name, type_name, text)
    if value < minimum:
        raise ValueError(f"config.pbtxt parameter {name} must be >= {minimum}{hint}, got {text!r}")
    setattr(opts, name, value)


def engine_config_from_triton(model_config: dict, args: dict) -> EngineConfig:
    """model_config: parsed config.pbtxt JSON; args: initialize() args (model_name, model_instance_name).

    Raises ValueError naming an unknown or malformed parameter."""
    raw = check_known(model_config)
    fields = engine_fields()
    kwargs = {}
    for k, v in raw.items():
        if k in DEPRECATED_ALIASES and v.strip() != "":  # EngineConfig warns and maps it
            kwargs[k] = _convert(k, fields[DEPRECATED_ALIASES[k]], v)
        elif k in fields and v.strip() != "":
            kwargs[k] = _convert(k, fields[k], v) if fields[k] != "str" else v
    kwargs["model_dir"] = resolve_model_dir(model_config)
    opts = serving_options(model_config)
    ordinal = instance_ordinal(model_config, args.get("model_name", ""), args.get("model_instance_name", ""))
    if opts.gcu_device_ids:
        if "device_id" in kwargs:
            raise ValueError("config.pbtxt sets both gcu_device_ids and device_id: set one")
        kwargs["device_id"] = opts.gcu_device_ids[ordinal % len(opts.gcu_device_ids)]
    elif "device_id" not in kwargs:
        kwargs["device_id"] = ordinal * max(1, kwargs.get("tensor_parallel_size", 1))
    if str(kwargs.get("tp_hosts", "")).strip():
        kwargs["tp_port"] = kwargs.get("tp_port", EngineConfig.tp_port) + ordinal
    for name in ("kv_events_endpoint", "kv_events_replay_endpoint"):  # one publisher per instance
        if kwargs.get(name, "").strip():
            kwargs[name] = offset_port(kwargs[name].strip(), ordinal)
    return EngineConfig(**kwargs)


def resolve_model_dir(model_config: dict) -> str:
    """The `model_dir` parameter of a config.pbtxt, or PADDLE_LLM_MODEL_DIR when it is empty.

    Raises ValueError when neither is set."""
    v = _raw(model_config).get("model_dir", "").strip() or os.environ.get(MODEL_DIR_ENV, "")
    if not v:
        raise ValueError(f"parameter model_dir is empty and {MODEL_DIR_ENV} is not set")
    return v
