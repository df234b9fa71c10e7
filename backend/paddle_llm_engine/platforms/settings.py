"""The operator's platform settings (dtype, kv_cache_dtype, kernels, quantization), checked and
parsed before anything is decided: EngineConfig.validate and decide() call these."""

from __future__ import annotations

from paddle_llm_ops.opset import QUANTIZATIONS

DTYPES = ("float32", "bfloat16", "float16")
DTYPE_CHOICES = ("auto",) + DTYPES
# The optional kernels a plan turns on or off; but for cpu_kernels (the plan's cpu_isa), each is
# the build_opset flag of the same name.
OPTIONAL_KERNELS = ("cpu_kernels", "fused_rms_norm", "fused_moe", "gcu_attention", "gcu_rotary", "gcu_rms_norm")
# quantization_group_size 0 (the default) means: wint4 in groups of 64 input channels (FastDeploy's
# wint4 group size), wint8 per output channel.
DEFAULT_GROUP_SIZES = {"wint8": -1, "wint4": 64}


def check_settings(dtype: str, kv_cache_dtype: str, quantization: str, quantization_group_size: int = 0) -> int:
    """The operator's dtype, kv_cache_dtype, quantization and quantization_group_size values (the
    only place they are checked: EngineConfig.validate and decide() call this). Returns the group
    size to use: -1 (one scale per output channel) or a positive multiple of 8; 0 (the default)
    resolves to DEFAULT_GROUP_SIZES[quantization] (-1 without quantization). Whether the group size
    divides each linear's input width is checked when the model's weights are quantized.
    Raises ValueError naming the setting."""
    for name, value in (("dtype", dtype), ("kv_cache_dtype", kv_cache_dtype)):
        if value not in DTYPE_CHOICES:
            raise ValueError(f"{name} must be one of {', '.join(DTYPE_CHOICES)}; got {value!r}")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be empty, wint8 or wint4; got {quantization!r}")
    g = quantization_group_size
    if isinstance(g, bool) or not isinstance(g, int) or not (g in (0, -1) or (g > 0 and g % 8 == 0)):
        raise ValueError(f"quantization_group_size must be 0 (the default: 64 for wint4, per output channel for "
                         f"wint8), -1 (one scale per output channel) or a positive multiple of 8 input channels "
                         f"per scale; got {g!r}")
    if not quantization:
        return -1
    return DEFAULT_GROUP_SIZES[quantization] if g == 0 else g


PREFILL_ACTIVATIONS = ("fp32", "int8")


def check_prefill_activations(value: str, quantization: str) -> str:
    """The wint8_prefill_activations setting: "fp32" or "int8" (case and spaces ignored), "int8" only
    with quantization wint8. Returns the normalized value; raises ValueError naming the setting."""
    v = str(value).strip().lower()
    if v not in PREFILL_ACTIVATIONS:
        raise ValueError(f"wint8_prefill_activations must be fp32 or int8; got {value!r}")
    if v == "int8" and quantization != "wint8":
        raise ValueError(f"wint8_prefill_activations int8 needs quantization wint8 (got quantization "
                         f"{quantization or 'none'!r})")
    return v


def parse_kernels_setting(value: str) -> tuple[str, tuple[str, ...]]:
    """`kernels` setting -> ("auto", ()), ("composed", ()) or ("list", names).

    "auto" (or empty): each optional kernel on where the place can run it; "composed": none, the
    plain Paddle ops only; "a;b": exactly these kernels, each must be runnable here.
    Raises ValueError naming an unknown kernel."""
    v = (value or "auto").strip().lower()
    if v in ("auto", "composed"):
        return v, ()
    names = tuple(n.strip() for n in v.replace(",", ";").split(";") if n.strip())
    unknown = [n for n in names if n not in OPTIONAL_KERNELS]
    if unknown or not names:
        raise ValueError(f"kernels must be 'auto', 'composed' or a ';'-separated list of "
                         f"{', '.join(OPTIONAL_KERNELS)}; got {value!r}")
    return "list", names
