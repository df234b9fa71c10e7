"""The signatures paddle-custom-gcu's custom ops must have for the engine to call them, and the ones
the installed plug-in registered.

The engine calls the plug-in's ops positionally (`_run_custom_op(name, *inputs, *attrs)`), so an op
whose inputs or attributes moved between wheel versions would be called wrongly without an error
(`fused_rotary_embedding_gcu` gained `head_size`; `get_token_penalty_multi_scores_gcu` went from 10
to 12 inputs). At start the platform layer compares each op's registered signature, read from
Paddle's operator proto (inputs with `@OPTIONAL` for paddle::Optional, outputs, attributes with
their types) and the custom operator's in-place map, with the one below; a mismatch turns that
kernel off and the log names both signatures. Never an exception: a plug-in we cannot read is
a kernel we do not use.

EXPECTED: read from PaddleCustomDevice backends/gcu/custom_op (PD_BUILD_OP of each op).
Known variants (ACCEPTED): fused_rotary_embedding_gcu with or without a trailing `head_size: int`.
Note reshape_and_cache_flash_gcu: its declared inputs are (key, value, key_cache, value_cache,
slot_mapping) but its kernel function takes (key_cache, value_cache, key, value, slot_mapping) and
FastDeploy calls it in the kernel's order; the declared names are compared here, the call order is
gcu/ops.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

# Attributes Paddle adds to every operator's proto (not the op's own).
_FRAMEWORK_ATTRS = frozenset({"op_role", "op_role_var", "op_namescope", "op_callstack", "op_device",
                              "with_quant_attr"})
_OPTIONAL_SUFFIX = "@OPTIONAL"
# Paddle's AttrType values as PD_BUILD_OP spells the C++ types.
_ATTR_TYPE_NAMES = {"INT": "int", "FLOAT": "float", "BOOL": "bool", "LONG": "int64_t", "STRING": "std::string",
                    "INTS": "std::vector<int>", "FLOATS": "std::vector<float>", "LONGS": "std::vector<int64_t>",
                    "STRINGS": "std::vector<std::string>", "FLOAT64": "double", "BOOLS": "std::vector<bool>"}


@dataclass(frozen=True)
class OpSignature:
    """inputs: names in order, optional ones as "Optional(name)"; outputs: names in order;
    attrs: "name: type" in order (PD_BUILD_OP's spelling, e.g. "is_neox: bool", "topk: int64_t");
    inplace: (input, output) pairs, sorted."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[str, ...] = ()
    inplace: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        s = f"({', '.join(self.inputs)}) -> ({', '.join(self.outputs)})"
        if self.attrs:
            s += f" attrs [{', '.join(self.attrs)}]"
        if self.inplace:
            s += f" inplace {{{', '.join(f'{i}->{o}' for i, o in self.inplace)}}}"
        return s


def _opt(name: str) -> str:
    return f"Optional({name})"


_FLASH_ATTRS = ("max_seqlen_q: int", "max_seqlen_k: int", "p_dropout: float", "softmax_scale: float",
                "zero_tensors: bool", "is_causal: bool", "window_size_left: int", "window_size_right: int",
                "softcap: float", "return_softmax: bool")

EXPECTED: dict[str, OpSignature] = {
    "flash_attn_var_len_gcu": OpSignature(
        ("query", "key", "value", "cu_seqlens_q", _opt("cu_seqlens_k"), _opt("seqused_k"), _opt("leftpad_k"),
         _opt("block_table"), _opt("alibi_slopes")), ("attention_out",), _FLASH_ATTRS),
    "reshape_and_cache_flash_gcu": OpSignature(
        ("key", "value", "key_cache", "value_cache", "slot_mapping"), ("key_cache_out", "value_cache_out"), (),
        (("key_cache", "key_cache_out"), ("value_cache", "value_cache_out"))),
    "fused_rotary_embedding_gcu": OpSignature(
        ("query", "key", "cos_sin_table", "positions"), ("query_out", "key_out"), ("is_neox: bool",)),
    "rms_norm_gcu": OpSignature(("x", "weight"), ("out",), ("epsilon: float",)),
    "fused_add_rms_norm_op": OpSignature(("x", "residual", "weight"), ("out", "residual_out"), ("epsilon: float",)),
    "topk_softmax_gcu": OpSignature(
        ("topk_weights", "topk_indices", "token_expert_indices", "gating_output"),
        ("topk_weights_out", "topk_indices_out", "token_expert_indices_out"), ("norm_topk_prob: bool",)),
    "moe_align_block_size_gcu": OpSignature(
        ("sorted_token_ids", "experts_ids", "num_tokens_post_pad", "topk_ids"),
        ("sorted_token_ids_out", "experts_ids_out", "num_tokens_post_pad_out"),
        ("num_experts: int", "block_size: int")),
    "fused_moe_kernel_gcu": OpSignature(
        ("C", "A", "B", _opt("bias"), "topk_weights", "topk_ids", "sorted_token_ids", "experts_ids",
         "num_tokens_post_pad"), ("C_out",), ("mul_routed_weight: bool", "topk: int64_t", "block_size: int64_t")),
    "linear_quant_gcu": OpSignature(("lhs", "rhs", "scale", _opt("bias")), ("linear_out",), ("group_size: int",)),
}

# Newer wheels' fused_rotary_embedding_gcu takes the head size as an attribute (FastDeploy passes it).
ROTARY_WITH_HEAD_SIZE = OpSignature(("query", "key", "cos_sin_table", "positions"), ("query_out", "key_out"),
                                    ("is_neox: bool", "head_size: int"))

ACCEPTED: dict[str, tuple[OpSignature, ...]] = {
    name: (sig,) for name, sig in EXPECTED.items()}
ACCEPTED["fused_rotary_embedding_gcu"] = (EXPECTED["fused_rotary_embedding_gcu"], ROTARY_WITH_HEAD_SIZE)
# The in-place map is not compared for the rotary (older wheels return new tensors, newer ones may
# write q/k in place): the engine uses the returned tensors either way.
_IGNORE_INPLACE = frozenset({"fused_rotary_embedding_gcu"})


def _attr_type_name(attr_type) -> str:
    name = getattr(attr_type, "name", None)
    if name is None:  # a plain int: Paddle's AttrType enum value
        from paddle.base import core

        name = core.AttrType(int(attr_type)).name
    return _ATTR_TYPE_NAMES.get(name, name.lower())


def registered_signature(name: str) -> OpSignature | None:
    """The signature of custom operator `name` as this process registered it (None when no such
    operator is loaded or its proto cannot be read). Reads Paddle's OpProto (inputs, outputs,
    attributes; Paddle's own framework attributes dropped) and
    core.eager._get_custom_operator_inplace_map (output index -> input index)."""
    try:
        from paddle.base import core
        from paddle.base.framework import OpProtoHolder

        if name not in core.get_all_op_names("fluid"):
            return None
        proto = OpProtoHolder.instance().get_op_proto(name)
    except Exception:  # an unreadable registry: the op is treated as absent
        return None
    inputs = tuple(_opt(i.name[:-len(_OPTIONAL_SUFFIX)]) if i.name.endswith(_OPTIONAL_SUFFIX) else i.name
                   for i in proto.inputs)
    outputs = tuple(o.name for o in proto.outputs)
    attrs = tuple(f"{a.name}: {_attr_type_name(a.type)}" for a in proto.attrs if a.name not in _FRAMEWORK_ATTRS)
    inplace: tuple[tuple[str, str], ...] = ()
    try:
        raw = core.eager._get_custom_operator_inplace_map(name)
    except Exception:  # no in-place map API in this Paddle, or not a custom op: none
        raw = {}
    plain_inputs = [i.name for i in proto.inputs]
    pairs = []
    for out_idx, in_idx in dict(raw or {}).items():
        i_name = plain_inputs[int(in_idx)].removesuffix(_OPTIONAL_SUFFIX)
        pairs.append((i_name, outputs[int(out_idx)]))
    inplace = tuple(sorted(pairs))
    return OpSignature(inputs, outputs, attrs, inplace)


def matches(name: str, registered: OpSignature | None) -> OpSignature | None:
    """The accepted signature of `name` that `registered` equals, else None."""
    if registered is None:
        return None
    for want in ACCEPTED.get(name, ()):
        got = registered
        if name in _IGNORE_INPLACE:
            got = OpSignature(got.inputs, got.outputs, got.attrs, want.inplace)
        if got == want:
            return want
    return None


def compare(name: str, registered: OpSignature | None = None, lookup=registered_signature) -> tuple[bool, str]:
    """(the registered signature of op `name` is one the engine calls correctly, one line saying so
    or naming both signatures). registered: given (tests), else read through `lookup`. Never raises:
    an op that is not registered, or unknown to EXPECTED, is (False, reason)."""
    if name not in EXPECTED:
        return False, f"{name}: no expected signature known to the engine"
    got = registered if registered is not None else lookup(name)
    if got is None:
        return False, f"{name} is not registered"
    want = matches(name, got)
    if want is not None:
        return True, f"{name} signature as expected: {want}"
    expected = " or ".join(str(s) for s in ACCEPTED[name])
    return False, f"{name} signature differs: registered {got}; expected {expected}"


def compare_all(names=tuple(EXPECTED), lookup=registered_signature) -> dict[str, tuple[bool, str]]:
    """{op: compare(op)} for the ops of `names` (registered ones only are worth it; absent ones
    report "not registered")."""
    return {n: compare(n, lookup=lookup) for n in names}


def rotary_takes_head_size() -> bool:
    """True when the registered fused_rotary_embedding_gcu is the newer variant with `head_size`."""
    return matches("fused_rotary_embedding_gcu", registered_signature("fused_rotary_embedding_gcu")) \
        == ROTARY_WITH_HEAD_SIZE
