"""Engine configuration (what the operator sets) and model configuration (read from config.json)."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import InitVar, dataclass, field

from paddle_llm_engine.hf_config import read_model_fields
from paddle_llm_engine.platforms.settings import check_prefill_activations, check_settings
from paddle_llm_engine.config_lora import check_lora_settings, parse_lora_modules
from paddle_llm_engine.config_tp_hosts import parse_tp_hosts  # noqa: F401 (EngineConfig.validate; re-exported)

log = logging.getLogger(__name__)

# max_num_waiting 0 (the default) = this many times max_num_seqs (128 at the default 32): room for a
# burst of four full batches, while a waiting request still waits at most about four request
# lifetimes of the running batch before it runs (docs/operations/limits.md).
WAITING_PER_SEQ_SLOT = 4
# deprecated EngineConfig / config.pbtxt names -> the current field
DEPRECATED_ALIASES = {"max_waiting_requests": "max_num_waiting"}
# EngineConfig.speculative_method values
SPECULATIVE_METHODS = ("none", "ngram")


@dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts hyper-parameters, the same for every family once read (hf_config.moe_fields).

    num_experts / top_k / intermediate_size: routed experts, experts per token, each expert's MLP
    width. layers: the decoder layers whose MLP is sparse, by the family's HF rule (the others are
    dense MLPs of ModelConfig.intermediate_size). shared_intermediate_size: width of the shared
    expert MLP every token also goes through (0: none); shared_expert_gate: Qwen2-MoE's
    sigmoid(x @ w) [H, 1] scale on it. router: "softmax_topk" (Qwen: top-k of the softmax,
    renormalized to sum 1 when norm_topk_prob) or "softmax_bias_topk" (ERNIE: experts picked by
    softmax + e_score_correction_bias, weighted by their softmax values / max(sum, norm_min))."""

    num_experts: int
    top_k: int
    intermediate_size: int
    layers: tuple[int, ...]
    router: str
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False
    norm_topk_prob: bool = False
    norm_min: float = 0.0


@dataclass
class ModelConfig:
    """Architecture hyper-parameters from an HF `config.json` (Llama family field names).

    Family-specific switches are kept as config.json names them; which projections they affect is
    decided per family in `models/` (e.g. Llama's attention_bias covers q/k/v/o, Qwen2 always has
    q/k/v biases, ERNIE 4.5's use_bias covers every Linear).
    rope_scaling: the normalized rope dict ("rope_type" set, "original_max_position_embeddings"
    filled in as HF does) or None for plain rotary; read from `rope_scaling` or transformers 5's
    `rope_parameters`, whichever the file has.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: list[int] = field(default_factory=list)
    mlp_bias: bool = False           # Llama: gate/up/down biases
    use_bias: bool = False           # ERNIE 4.5: biases on every Linear except lm_head
    use_sliding_window: bool = False  # Qwen2/3: sliding-window layers (not supported: the model refuses it)
    hidden_act: str = "silu"
    qkv_bias: bool = True            # Qwen2-MoE: q/k/v biases (Qwen2MoeConfig.qkv_bias)
    moe: MoEConfig | None = None     # mixture-of-experts families; None: every MLP is dense

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike) -> "ModelConfig":
        """Read config.json (+ generation_config.json for EOS ids; hf_config.read_model_fields).
        Raises FileNotFoundError without config.json, ValueError for an unsupported MoE setting."""
        fields = read_model_fields(model_dir)
        moe = fields.pop("moe")
        return cls(**fields, moe=MoEConfig(**moe) if moe is not None else None)


@dataclass
class EngineConfig:
    """Operator settings of one engine (one per Triton model instance).

    Each field is also a config.pbtxt parameter of the `llm` model with the same name and default
    (the Triton adapter's config_params). This docstring is their documentation: the configuration
    reference (docs/reference/configuration.md) is generated from it, and a unit test fails when a
    field has no entry here. One entry per field, "name: text", continuation lines indented.

    model_dir: HF model folder (config.json, *.safetensors, tokenizer files). In config.pbtxt an empty
        value means $PADDLE_LLM_MODEL_DIR, which `make serve` sets from MODEL_DIR; a non-empty value
        there always wins.
    device: "auto" (GCU when paddle-custom-gcu is installed or registered the `gcu` device type, else
        CPU; an installed plug-in that did not load, or one of an unsupported version, refuses the
        start with the versions found: it never falls back to the CPU), "cpu" or "gcu" ("gcu:<id>"
        in the engine).
    device_id: the device of the instance (with tensor_parallel_size N, its first device). In
        config.pbtxt empty (the default) = the instance ordinal k times tensor_parallel_size; a value
        pins every instance to that id; cannot be combined with gcu_device_ids (see Instances).
    block_size: tokens per KV block (a power of two).
    num_kv_blocks: KV blocks; 0 means size from a memory budget. Wins over both budgets below.
    kv_cache_memory_fraction: 0 (off) or in (0, 1]: the KV budget is this fraction of the memory
        available once the weights are loaded (CPU: the host's MemAvailable, capped by the headroom
        under a cgroup memory limit; GCU: the TOPS runtime's free figure, topsMemGetInfo, where
        $PADDLE_LLM_TOPSRT_LIBRARY names libtopsrt.so if the loader cannot find it, else the device
        total minus what Paddle's allocator holds, as the plug-in reports it). Wins over
        kv_cache_memory_bytes, which is the fallback (with a warning) when the device reports
        neither; the KV log line says which. Each instance takes its share of what is free when it
        starts.
    kv_cache_memory_bytes: budget for K+V of all layers when num_kv_blocks and
        kv_cache_memory_fraction are 0 (default 1 GiB).
    max_num_seqs: sequences in one step (decode batch limit).
    max_num_batched_tokens: tokens in one step (prefill chunk budget): longer prompts are prefilled in
        chunks.
    prefill_chunk_size: while sequences decode, at most this many prompt tokens join a step, so a
        wave of arriving prompts delays running streams by one chunk per step, not by the whole
        wave's prefill; 0: no cap beyond max_num_batched_tokens.
    scheduling_policy: "fcfs" (the default: arrival order) or "priority": waiting requests are served
        by their `priority` (a lower value first, default 0; then arrival), and a request more urgent
        than a running one that lacks a sequence slot or KV blocks preempts the least urgent running
        sequence (recomputed later, output unchanged). vLLM's setting and values.
    kv_events_endpoint: "" (off) or a ZeroMQ address to bind ("tcp://*:5557", "ipc:///path"): the
        prefix cache's changes are published there in vLLM's KV-event format for KV-aware routers
        (kv_events.py; docs/features/kv_events.md); needs enable_prefix_caching. In config.pbtxt
        instance k binds the tcp port + k.
    kv_events_replay_endpoint: "" (none) or a ZeroMQ address for the replay socket (ROUTER) that
        re-sends buffered batches from a sequence number on (instance k: port + k).
    kv_events_topic: the topic frame of every KV-event message (vLLM's default: empty).
    max_model_len: prompt + output limit per sequence; 0 means the model's max_position_embeddings.
    num_threads: CPU threads for Paddle and the C++ kernels; 0 means the CPUs this process may use
        (its affinity mask and cgroup CPU quota, rounded up; shared evenly by tensor-parallel ranks).
    adaptive_kernel_threads: 1: with 2 or more kernel threads, each decode-stack call of the C++
        CPU kernels runs on 1 or num_threads threads, whichever its measured call times favour per
        batch size (paddle_llm_ops/cpu_kernels/thread_tuner.py, docs/design/kernels.md); 0 (the
        default since the kernels' thread pool, which keeps two threads useful beside other work):
        always num_threads. Results are the same either way.
    huge_pages: 1 (the default): on the CPU, the weights are put on 2 MiB transparent huge pages at
        start (MADV_HUGEPAGE + MADV_COLLAPSE) and the KV cache is advised for khugepaged, where the
        host allows it (platforms/huge_pages.py; the start-up log says what happened, "huge pages:
        weights: ..."); 0: left on the allocator's pages. Results are the same either way.
    enable_prefix_caching: 1 reuses KV blocks of equal prompt prefixes across requests; 0 disables.
    max_num_waiting: admission limit: requests admitted and not finished that are not running
        (submitted and not yet applied by the engine thread, plus the scheduler's waiting and
        preempted sequences) less the running slots free (max_num_seqs less the running
        sequences), i.e. those that must wait for a slot; so at most max_num_seqs +
        max_num_waiting are in flight. At the limit a new request is refused at once
        (EngineBusyError, Triton UNAVAILABLE "server busy: 128 requests waiting (max_num_waiting
        128); retry later"; docs/operations/limits.md). 0 (the default) = WAITING_PER_SEQ_SLOT x
        max_num_seqs (128 with the default max_num_seqs 32); resolved by validate().
    max_waiting_requests: deprecated alias of max_num_waiting (accepted with a warning); setting both
        is an error at load.
    max_request_seconds: server-side deadline of every request, in seconds from its arrival at the
        engine; 0 = none. A request's own timeout (EngineLoop.submit timeout_s) can only shorten it.
        At the deadline the engine aborts the request and frees its KV blocks (LLMEngine.add_prepared;
        docs/operations/limits.md).
    dtype: weights and activations: "auto" (the fastest dtype the place has kernels for: float32
        on CPU, bfloat16 on a GCU whose plug-in registers bf16 kernels for every op of the model;
        docs/platforms/platform_layer.md), "float32", "bfloat16", "float16"; a dtype the place lacks
        kernels for is refused at start (Paddle's CPU wheel has no bf16 / fp16 matmul).
    kv_cache_dtype: "auto" (= dtype), "float32", "bfloat16" or "float16". Under float32 compute on
        the CPU with the C++ kernels, a 16-bit cache is read by the kernels themselves: each K / V
        value is rounded once when written and widened exactly when read, arithmetic stays fp32, a
        block takes half the memory and decode attention reads half the bytes (SmolLM2: prefill
        logits within 0.0014 (fp16) / 0.014 (bf16) of the logits' standard deviation of an fp32
        cache; tests/model/test_kv_cache_16bit.py); outputs then depend on batch composition more
        than with float32 (docs/features/kv_cache.md). float16 holds magnitudes up to 65504.
        Elsewhere a dtype narrower than dtype is storage only (cast on write and read).
    kernels: "auto" (each optional fused kernel where the platform layer finds the place can run
        it), "composed" (plain Paddle ops only), or a ';'-separated list of kernels to require
        (cpu_kernels, fused_rms_norm, fused_moe, gcu_attention, gcu_rotary, gcu_rms_norm; e.g.
        "cpu_kernels;fused_rms_norm"), refused at start with the reason where the place cannot run
        one.
    quantization: "" (weights in dtype), "wint8" or "wint4": weight-only int8 / int4, symmetric,
        quantized at load from the checkpoint, for every linear and the LM head (the embedding keeps
        its rows; activations stay in dtype). CPU: the C++ int8 / int4 GEMV, fp32 scales (needs
        cpu_kernels, refused at start otherwise); a GCU: paddle-custom-gcu's linear_quant_gcu,
        refused at start where it is not registered with the expected signature or fails its
        check. SmolLM2: linear weights 0.25x (wint8) / 0.14x (wint4, groups of 64) the fp32 bytes;
        accuracy and speed in docs/features/quantization.md.
    quantization_group_size: input channels per scale: 0 (the default: 64 for wint4 as FastDeploy,
        per output channel for wint8), -1 (one scale per output channel) or a positive multiple of
        8 dividing every linear's input width (else refused at start naming the setting and the
        width); a GCU takes -1, 64, 128.
    wint8_prefill_activations: with quantization wint8 on the CPU, how steps of more than 64 rows
        (prompt chunks, and the decode rows that share a step with them) multiply: "fp32" (the
        default: fp32 activations by the dequantized weights, as precise as weight-only int8) or
        "int8" (activations quantized to int8 per row and block of 32, as decode rows always are and
        llama.cpp's Q8_0 does everywhere: the int8 GEMM, several times faster, less precise; see
        docs/features/quantization.md). "int8" takes effect where the int8 GEMM runs (AVX-512
        VNNI); elsewhere the start log says fp32 stays. Refused without quantization wint8.
    tensor_parallel_size: N > 1 shards the model over N worker processes, one per device
        (device_id .. device_id + N - 1; on CPU the ids only label the ranks); the engine, scheduler
        and sampler stay in this process (paddle_llm_engine/tp; docs/features/tensor_parallel.md).
        KV budgets are per rank. N must divide the attention heads, be a multiple or a divisor of
        the KV heads and fit the devices (CPU: at most the CPUs this process may use, affinity and
        cgroup quota; GCU: the devices device_id .. device_id + N - 1 must exist), else the start is
        refused naming both numbers.
    tp_hosts: "" (the default: every rank on this host) or where the ranks run, comma-separated
        "address[:ranks]" entries in rank order ("10.0.0.1,10.0.0.2" or "hostA:2,hostB:2"; ranks
        default 1, their sum must be tensor_parallel_size; an address may appear once; IPv4
        addresses or host names, resolved at start). The first entry is this host: the executor
        starts its ranks (0 .. k-1) and binds the step channel to that address (never 0.0.0.0); the ranks of the other entries are started there by the operator
        (executor/tp_worker.py --connect) and join over TCP, authenticated by the shared token
        PADDLE_LLM_TP_TOKEN (see executor/remote.py, docs/deployment/multi_host_tp.md).
    tp_port: the TCP port of the step channel on the first tp_hosts address (used only with
        remote ranks; 0 is refused then). Instance k of a model listens on tp_port + k.
    tp_join_timeout_s: how long the start waits for the remote ranks to join (> 0 s); the start
        then fails naming the ranks that did not and the command that starts them, e.g.
        "tensor-parallel worker rank 1 on 10.0.0.2 did not join within 300 s (tp_join_timeout_s);
        start each there with: ... --connect 10.0.0.1:29650 --rank <r>".
    speculative_method: "none" (the default) or "ngram": n-gram (prompt-lookup) speculative
        decoding, vLLM's names (spec_decode/, docs/features/speculative_decoding.md): a decoding
        sequence proposes up to num_speculative_tokens draft tokens by matching its last
        prompt_lookup_max .. prompt_lookup_min tokens against its earlier tokens, and one step
        verifies them all; greedy output is unchanged, sampled output keeps its distribution. Off by
        default until measured on a quiet host.
    num_speculative_tokens: k, draft tokens proposed per sequence and step (>= 1; k + 1 <=
        max_num_batched_tokens).
    prompt_lookup_min / prompt_lookup_max: the n-gram lengths tried, longest first
        (1 <= min <= max).
    reasoning_parser: "auto" (the default: the thinking family of the model's type when its chat
        template thinks and its tokenizer has the markers; else off, logged once), "none", or a
        family (qwen3, ernie45, deepseek_r1; reasoning/registry.py). A thinking span is what
        reasoning_max_tokens budgets, what guided decoding waits for, and what the outputs split.
    enable_lora: 1 serves LoRA adapters (HF PEFT folders) of the base model; requests name one
        (lora_name) and share steps (docs/features/lora.md); 0 (default): LoRA fields are refused.
    lora_modules: adapters loaded at start: "name=path" entries (commas or spaces; vLLM's
        --lora-modules) or a JSON list of {"name", "path"}; a bad folder stops the start.
    max_loras: adapters one step may use (device slots); a further adapter's requests wait.
    max_lora_rank: the largest LoRA rank accepted.
    max_cpu_loras: prepared adapters each worker keeps in host memory (LRU); 0 = max_loras.
    """

    model_dir: str
    device: str = "auto"
    device_id: int = 0
    block_size: int = 64
    num_kv_blocks: int = 0
    kv_cache_memory_fraction: float = 0.0
    kv_cache_memory_bytes: int = 1 << 30
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    prefill_chunk_size: int = 256
    scheduling_policy: str = "fcfs"
    kv_events_endpoint: str = ""
    kv_events_replay_endpoint: str = ""
    kv_events_topic: str = ""
    max_model_len: int = 0
    num_threads: int = 0
    adaptive_kernel_threads: int = 0
    huge_pages: int = 1
    enable_prefix_caching: int = 1
    max_num_waiting: int = 0
    max_request_seconds: float = 0.0
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    kernels: str = "auto"
    quantization: str = ""
    quantization_group_size: int = 0
    wint8_prefill_activations: str = "fp32"
    tensor_parallel_size: int = 1
    tp_hosts: str = ""
    tp_port: int = 29650
    tp_join_timeout_s: float = 300.0
    speculative_method: str = "none"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    reasoning_parser: str = "auto"
    enable_lora: int = 0
    lora_modules: str = ""
    max_loras: int = 4
    max_lora_rank: int = 16
    max_cpu_loras: int = 0
    max_waiting_requests: InitVar[int | None] = None

    def __post_init__(self, max_waiting_requests: int | None) -> None:
        if max_waiting_requests is None:
            return
        if self.max_num_waiting:
            raise ValueError(f"max_num_waiting ({self.max_num_waiting}) and its deprecated alias max_waiting_requests "
                             f"({max_waiting_requests}) are both set: set max_num_waiting only")
        if max_waiting_requests <= 0:  # under the old name 0 never meant "the default"
            raise ValueError(f"max_waiting_requests must be > 0, got {max_waiting_requests}")
        log.warning("max_waiting_requests is deprecated: use max_num_waiting (set to %d)", max_waiting_requests)
        self.max_num_waiting = max_waiting_requests

    def validate(self, model: ModelConfig) -> None:
        """Resolve defaults against the model and check ranges; raises ValueError naming the field."""
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a positive power of two, got {self.block_size}")
        if self.max_model_len <= 0:
            self.max_model_len = model.max_position_embeddings
        if self.max_model_len > model.max_position_embeddings:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                f"{model.max_position_embeddings}"
            )
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be > 0, got {self.max_num_seqs}")
        if self.huge_pages not in (0, 1):
            raise ValueError(f"huge_pages must be 0 or 1, got {self.huge_pages}")
        if self.adaptive_kernel_threads not in (0, 1):
            raise ValueError(f"adaptive_kernel_threads must be 0 or 1, got {self.adaptive_kernel_threads}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs})"
            )
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.tp_hosts.strip():
            parse_tp_hosts(self.tp_hosts, self.tensor_parallel_size)
            if not 0 < self.tp_port < 65536:
                raise ValueError(f"tp_port must be in 1..65535 when tp_hosts is set, got {self.tp_port}")
            if not (math.isfinite(self.tp_join_timeout_s) and self.tp_join_timeout_s > 0):
                raise ValueError(f"tp_join_timeout_s must be > 0, got {self.tp_join_timeout_s}")
        self.validate_speculative()
        check_lora_settings(self)
        for name in ("kv_events_endpoint", "kv_events_replay_endpoint"):
            v = getattr(self, name).strip()
            if v and not v.startswith(("tcp://", "ipc://")):
                raise ValueError(f"{name} must be a tcp:// or ipc:// address, got {v!r}")
            setattr(self, name, v)
        if self.kv_events_replay_endpoint and not self.kv_events_endpoint:
            raise ValueError("kv_events_replay_endpoint needs kv_events_endpoint")
        if self.kv_events_endpoint and not self.enable_prefix_caching:
            raise ValueError("kv_events_endpoint needs enable_prefix_caching 1 (the events describe the prefix cache)")
        self.scheduling_policy = self.scheduling_policy.strip().lower()
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be fcfs or priority, got {self.scheduling_policy!r}")
        if self.prefill_chunk_size < 0:
            raise ValueError(f"prefill_chunk_size must be >= 0 (0 = no cap), got {self.prefill_chunk_size}")
        if self.max_num_waiting < 0:
            raise ValueError(f"max_num_waiting must be >= 0 (0 = {WAITING_PER_SEQ_SLOT} x max_num_seqs), "
                             f"got {self.max_num_waiting}")
        if self.max_num_waiting == 0:
            self.max_num_waiting = WAITING_PER_SEQ_SLOT * self.max_num_seqs
        if not (math.isfinite(self.max_request_seconds) and self.max_request_seconds >= 0):
            raise ValueError(f"max_request_seconds must be >= 0 (0 = no limit), got {self.max_request_seconds}")
        if self.num_kv_blocks < 0 or self.kv_cache_memory_bytes <= 0:
            raise ValueError("num_kv_blocks must be >= 0 and kv_cache_memory_bytes > 0")
        check_settings(self.dtype, self.kv_cache_dtype, self.quantization, self.quantization_group_size)
        check_prefill_activations(self.wint8_prefill_activations, self.quantization)
        if not (0.0 <= self.kv_cache_memory_fraction <= 1.0):
            raise ValueError(f"kv_cache_memory_fraction must be 0 (off) or in (0, 1], "
                             f"got {self.kv_cache_memory_fraction}")

    def lora_module_entries(self) -> list[tuple[str, str]]:
        """[(name, path)] of lora_modules (config_lora.parse_lora_modules; ValueError naming it)."""
        return parse_lora_modules(self.lora_modules)

    @property
    def speculative(self) -> bool:
        """True when speculative decoding is on (speculative_method is not "none")."""
        return self.speculative_method.strip().lower() not in ("", "none")

    def validate_speculative(self) -> None:
        """Check the speculative-decoding settings; raises ValueError naming the setting."""
        method = self.speculative_method.strip().lower() or "none"
        if method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_method must be one of {', '.join(SPECULATIVE_METHODS)}, "
                             f"got {self.speculative_method!r}")
        self.speculative_method = method
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if self.prompt_lookup_min < 1:
            raise ValueError(f"prompt_lookup_min must be >= 1, got {self.prompt_lookup_min}")
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise ValueError(f"prompt_lookup_max ({self.prompt_lookup_max}) must be >= prompt_lookup_min "
                             f"({self.prompt_lookup_min})")
        if self.speculative and self.num_speculative_tokens + 1 > self.max_num_batched_tokens:
            raise ValueError(f"num_speculative_tokens ({self.num_speculative_tokens}) + 1 must be <= "
                             f"max_num_batched_tokens ({self.max_num_batched_tokens})")
