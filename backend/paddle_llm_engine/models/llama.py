"""Llama-architecture decoder (Touvron et al. 2023) in Paddle, over a paged KV cache; the base of
every supported family (see arch.py for the switches Qwen2, Qwen3 and ERNIE 4.5 set).

Matches HF transformers' LlamaForCausalLM: RMSNorm pre-norm blocks, rotary embeddings (rotate-half
form), grouped-query attention, SwiGLU MLP, optional tied embeddings, optional attention / MLP
biases. q/k/v are fused into one matmul and gate/up into another; the attention reads and writes
the cache through the engine's OpSet (the kernels the platform layer chose for the place). Weights
and activations are in the engine's compute dtype (float32 on CPU); logits are returned in fp32.
"""

from __future__ import annotations

import math

import numpy as np
import paddle

from paddle_llm_ops.host_tensor import from_numpy
from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.models.arch import DecoderArch
from paddle_llm_engine.models.attention_metadata import AttentionMetadata, BlockTablesMetadata, RowTablesMetadata
from paddle_llm_engine.models.weights import CheckpointReader
from paddle_llm_ops import COMPOSED, OpSet, RotaryTable, interleaved_to_half_order


def _tensor(a: np.ndarray | None, dtype: str) -> paddle.Tensor | None:
    """An fp32 numpy weight as a constant tensor of the compute dtype on the current device."""
    if a is None:
        return None
    t = from_numpy(a)
    if dtype != "float32":
        t = t.astype(dtype)
    t.stop_gradient = True
    return t


class DenseMLP:
    """SwiGLU MLP: gate_up [H] -> [2I] (gate columns first), down [I] -> [H], with biases where the
    arch has them; read from `<prefix>{gate,up,down}_proj.{weight,bias}` (I: the tensors' own width)
    and stored as the OpSet's linears (ops.make_linear)."""

    def __init__(self, r: CheckpointReader, prefix: str, bias: bool, dtype: str, ops: OpSet = COMPOSED):
        m = prefix
        gate_up_bias = down_bias = None
        if bias:
            gate_up_bias = np.concatenate([r.get(m + "gate_proj.bias"), r.get(m + "up_proj.bias")])
            down_bias = r.get(m + "down_proj.bias")
        self.gate_up = ops.make_linear(np.concatenate([r.linear(m + "gate_proj.weight"), r.linear(m + "up_proj.weight")],
                                                      axis=1), gate_up_bias, dtype)
        self.down = ops.make_linear(r.linear(m + "down_proj.weight"), down_bias, dtype)
        self.act = ops.swiglu

    def __call__(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.down(self.act(self.gate_up(x)))


class LlamaLayer:
    """Weights of one decoder block: qkv [H] -> [(nh+2kvh)*d] and o [nh*d] -> [H] as OpSet linears
    (with biases where the arch has them); q_norm / k_norm [d] (qk_norm only); mlp: x [T, H] -> [T, H]
    (a DenseMLP unless the model gives another, e.g. a mixture of experts)."""

    def __init__(self, r: CheckpointReader, i: int, cfg: ModelConfig, arch: DecoderArch, dtype: str = "float32",
                 mlp=None, ops: OpSet = COMPOSED):
        def _t(a):
            return _tensor(a, dtype)

        p = f"model.layers.{i}."
        a = p + "self_attn."
        d = cfg.head_dim
        # Interleaved rotary runs as rotate-half once q/k rows are permuted within each head.
        order = interleaved_to_half_order(d) if arch.rope_interleaved else None

        def heads_permuted(x: np.ndarray) -> np.ndarray:  # rows of an HF [heads*d, ...] q/k tensor
            return x if order is None else x.reshape(-1, d, *x.shape[1:])[:, order].reshape(x.shape)

        def proj(x: str, kind: str) -> np.ndarray:
            w = r.get(f"{a}{x}_proj.{kind}")
            return heads_permuted(w) if x in "qk" else w

        self.in_norm = _t(r.get(p + "input_layernorm.weight"))
        self.post_norm = _t(r.get(p + "post_attention_layernorm.weight"))
        self.qkv = ops.make_linear(np.concatenate([proj(x, "weight") for x in "qkv"], axis=0).T,
                                   np.concatenate([proj(x, "bias") for x in "qkv"]) if arch.qkv_bias else None, dtype)
        self.q_norm = self.k_norm = None
        if arch.qk_norm:
            self.q_norm = _t(heads_permuted(r.get(a + "q_norm.weight")))  # [d]: one "head"
            self.k_norm = _t(heads_permuted(r.get(a + "k_norm.weight")))
        self.o = ops.make_linear(r.linear(a + "o_proj.weight"), r.get(a + "o_proj.bias") if arch.o_bias else None,
                                 dtype)
        self.mlp = mlp if mlp is not None else DenseMLP(r, p + "mlp.", arch.mlp_bias, dtype, ops)


def _row_tables(meta: AttentionMetadata, rows: int) -> tuple[paddle.Tensor, paddle.Tensor] | None:
    """(block tables [rows, max_blocks] int32, context lengths [rows] int32) giving each of the
    step's rows its own: a RowTablesMetadata step's row tables, a decode-only "block_tables" step's
    decode tables (each row one sequence's next token); None for every other step."""
    if isinstance(meta, RowTablesMetadata):
        return meta.row_block_tables, meta.row_context_lens
    if isinstance(meta, BlockTablesMetadata) and not meta.prefills and meta.num_decodes == rows:
        return meta.decode_block_tables, meta.decode_context_lens
    return None


class LlamaForCausalLM:
    """forward(input_ids [T] int64, positions [T] int64, meta, kv_caches) -> hidden [T, H] fp32;
    compute_logits(hidden [B, H]) -> [B, V] fp32.

    ops: the kernels to call (paddle_llm_ops.OpSet, chosen by the platform layer); dtype: the compute
    dtype of weights and activations ("float32", "bfloat16", "float16").
    Subclasses (other families) override `arch_for`, and `make_mlp` for mixture-of-experts layers."""

    # Checkpoint tensors HF's class ignores at load (its _keys_to_ignore_on_load_unexpected), by substring.
    IGNORED_TENSORS: tuple[str, ...] = ()
    # The forward may hand a step to the OpSet's one-call decoder (make_decode_stack), which runs the
    # plain dense stack of this class. False in a class that changes how the layers combine (its own
    # reduce of row-parallel outputs, mixture-of-experts MLPs, its own forward).
    supports_decode_stack: bool = True
    # The step's LoRA rows (lora.weights.LoraBatch), set by the worker around forward(); None: no
    # row of the step has an adapter.
    lora_batch = None

    @staticmethod
    def arch_for(cfg: ModelConfig) -> DecoderArch:
        """Llama: attention_bias puts biases on q/k/v/o, mlp_bias on gate/up/down."""
        return DecoderArch(qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias, mlp_bias=cfg.mlp_bias)

    def __init__(self, cfg: ModelConfig, ops: OpSet = COMPOSED, dtype: str = "float32"):
        if cfg.hidden_act != "silu":
            raise ValueError(f"hidden_act {cfg.hidden_act!r} is not supported (supported: silu)")
        self.cfg = cfg
        self.ops = ops
        self.dtype = dtype
        self.arch = self.arch_for(cfg)
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self.layers: list[LlamaLayer] = []
        self.decode_stack, self.decode_stack_info = None, "off (weights not loaded)"
        # Built here, not at load: an unsupported rope_scaling fails before any weight is read.
        self.rotary = RotaryTable(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)

    def load_weights(self, model_dir: str) -> None:
        """Load from HF safetensors. Raises KeyError naming a missing tensor, ValueError when the
        checkpoint holds tensors this configuration does not use (e.g. biases the config omits)."""
        r = self.open_checkpoint(model_dir)
        cfg = self.cfg

        def _t(a):
            return _tensor(a, self.dtype)

        self.embed = _t(r.get("model.embed_tokens.weight"))  # [V, H]
        self.norm = _t(r.get("model.norm.weight"))
        self.layers = [LlamaLayer(r, i, cfg, self.arch, self.dtype, self.make_mlp(r, i), self.ops)
                       for i in range(cfg.num_hidden_layers)]
        # Tied: the logits are h @ embed^T, read from the embedding itself (no second copy, except
        # the int8 copy of wint8).
        self.tied = cfg.tie_word_embeddings
        self.lm_head = self.embed if self.tied else _t(r.get("lm_head.weight"))  # [V, H] either way
        self.lm_head_op = self.ops.make_lm_head(self.lm_head)
        self.decode_stack, self.decode_stack_info = self._make_decode_stack()
        unused = [n for n in r.unread() if not n.endswith("rotary_emb.inv_freq")
                  and not (self.tied and n == "lm_head.weight")  # HF ignores a tied checkpoint's lm_head
                  and not any(x in n for x in self.IGNORED_TENSORS)]
        if unused:
            more = f" and {len(unused) - 8} more" if len(unused) > 8 else ""
            raise ValueError(f"checkpoint tensors not used by model_type {cfg.model_type!r} with this config.json "
                             f"(config and weights disagree?): {', '.join(unused[:8])}{more}")

    def _make_decode_stack(self):
        """(the OpSet's one-call decoder for decode-only steps, or None; a line saying which and why).
        Only for a class whose supports_decode_stack says it runs the plain dense decoder; the
        OpSet's stack checks each linear's declared kind and layout."""
        if self.ops.make_decode_stack is None:
            return None, "off (the OpSet has none: composed or device kernels)"
        if not self.supports_decode_stack:
            return None, f"off ({type(self).__name__} combines its layers its own way)"
        if self.dtype != "float32":
            return None, f"off (compute dtype {self.dtype})"
        from paddle_llm_ops.cpu_kernels.decode_stack import StackLayer

        layers = [StackLayer(lay.in_norm, lay.post_norm, lay.q_norm, lay.k_norm, lay.qkv, lay.o, lay.mlp.gate_up,
                             lay.mlp.down) for lay in self.layers]
        inter = self.layers[0].mlp.gate_up.out_features // 2  # [H] -> [2I] (the stack checks each layer)
        stack, info = self.ops.make_decode_stack(layers, self.norm, self.cfg.hidden_size, inter, self.num_heads,
                                                 self.num_kv_heads, self.head_dim, self.cfg.rms_norm_eps, self.scale)
        return stack, (info if stack is not None else f"off ({info})")

    def shard_tensor(self, name: str, w: np.ndarray) -> np.ndarray:
        """A tensor laid out like checkpoint tensor `name`, cut as open_checkpoint cuts that one
        (LoRA factors follow their base projection): the whole tensor here."""
        return w

    def open_checkpoint(self, model_dir: str) -> CheckpointReader:
        """The reader load_weights takes every tensor from (tensor parallel: a rank's shard of it)."""
        return CheckpointReader(model_dir)

    def embed_tokens(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        """input_ids [T] -> [T, H] (tensor parallel: a vocabulary shard's rows, summed over ranks)."""
        return paddle.index_select(self.embed, input_ids, axis=0)

    def reduce_partial(self, x: paddle.Tensor) -> paddle.Tensor:
        """The output of a row-parallel projection (o_proj, the MLP's down_proj) made whole: the
        identity here; tensor parallel sums the ranks' partial results (all_reduce)."""
        return x

    def make_mlp(self, r: CheckpointReader, i: int):
        """Layer i's MLP, or None for the dense one (mixture-of-experts families override this)."""
        return None

    def forward(self, input_ids: paddle.Tensor, positions: paddle.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[paddle.Tensor, paddle.Tensor]]) -> paddle.Tensor:
        """input_ids [T] int64, positions [T] int64, meta: the step's metadata in the OpSet's form,
        kv_caches [(k, v)] per layer (written with this step's keys and values) -> hidden [T, H]
        after the final norm. Steps whose form gives every row its own block table run on the
        decode stack when the model has one; the rest layer by layer through the OpSet."""
        eps = self.cfg.rms_norm_eps
        ops = self.ops
        nh, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        h = self.embed_tokens(input_ids)  # [T, H]: the residual stream
        rot = ops.rotary_inputs(self.rotary, positions, self.dtype)
        lora = self.lora_batch
        stack_lora = lora.stack_inputs() if lora is not None and self.decode_stack is not None else None
        rows = None
        if self.decode_stack is not None and (lora is None or stack_lora is not None):
            rows = _row_tables(meta, h.shape[0])
        if rows is not None:  # every row a query over its own context: the whole stack in one call
            out = self.decode_stack.run(h, rot.positions, rot.table_cos, rot.table_sin, meta.slot_mapping, *rows,
                                        kv_caches, *(stack_lora or ()))
            if out is not None:  # None: a batch above the kernels' limit
                return out
        # Each residual add is fused with the norm that follows it: `delta` is the output not yet
        # added to h (the previous block's MLP; None before the first layer).
        delta = None
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            if delta is None:
                x = ops.rms_norm(h, layer.in_norm, eps)
            else:
                x, h = ops.add_rms_norm(delta, h, layer.in_norm, eps)
            qkv = layer.qkv(x) if lora is None else lora.apply(ops, i, "qkv", x, layer.qkv(x))
            q = ops.qkv_rotary_write(qkv, rot, k_cache, v_cache, meta.slot_mapping, nh, kvh, d,
                                     layer.q_norm, layer.k_norm, eps)
            attn = ops.attention(q, k_cache, v_cache, meta, self.scale)  # [T, nh*d]: one call per layer
            o = layer.o(attn) if lora is None else lora.apply(ops, i, "o", attn, layer.o(attn))
            x, h = ops.add_rms_norm(self.reduce_partial(o), h, layer.post_norm, eps)
            if lora is None or not isinstance(layer.mlp, DenseMLP):
                mlp = layer.mlp(x)
            else:  # LoRA deltas on the row-parallel partials too: the reduce sums them with the rest
                g = lora.apply(ops, i, "gate_up", x, layer.mlp.gate_up(x))
                a = layer.mlp.act(g)
                mlp = lora.apply(ops, i, "down", a, layer.mlp.down(a))
            delta = self.reduce_partial(mlp)
        return ops.add_rms_norm(delta, h, self.norm, eps)[0]

    def compute_logits(self, hidden: paddle.Tensor) -> paddle.Tensor:
        """hidden [B, H] -> logits [B, V] fp32."""
        logits = self.lm_head_op(hidden)
        return logits if logits.dtype == paddle.float32 else logits.astype("float32")
