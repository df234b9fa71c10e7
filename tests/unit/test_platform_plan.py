"""The platform layer's decisions (platforms/plan.py) for hosts we have and hosts we do not:
an AVX2-only CPU, an AVX-512 CPU, a GCU plug-in with bf16 kernels, and the test stand-in plug-in
with no kernels of its own. The facts are given; nothing here needs those machines."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from paddle_llm_engine import EngineConfig, LLMEngine
from paddle_llm_engine.platforms import KernelRegistry, PlaceFacts, PlatformError, decide, parse_cpuinfo
from paddle_llm_engine.platforms import cpu_features
from paddle_llm_engine.platforms.kernel_checks import ChildVerdict
from paddle_llm_engine.platforms.plan import COMPUTE_OPS, FUSED_MOE_OPS, KV_WRITE_OPS
from paddle_llm_engine.platforms.process_plan import plan_for_device

# /proc/cpuinfo of the AVX2-only AMD EPYC (family 25) on which Paddle's fused RMSNorm died with SIGILL.
EPYC_AVX2 = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model name	: AMD EPYC 7B13
flags		: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext invpcid_single ssbd ibrs ibpb stibp vmmcall fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves clzero xsaveerptr rdpru wbnoinvd arat npt nrip_save umip vaes vpclmulqdq rdpid fsrm
"""
XEON_AVX512 = """processor	: 0
model name	: Intel(R) Xeon(R) Processor
flags		: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl
"""
# A Zen 5 EPYC as issue 17 measured on: AVX-512 with VNNI (the int8 x int8 GEMV's vpdpbusd path).
ZEN5_VNNI = """processor	: 0
model name	: AMD EPYC 9B45
flags		: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi avx512_vnni avx512_bitalg
"""
OLD_SSE_ONLY = """model name	: QEMU Virtual CPU
flags		: fpu sse sse2 ssse3
"""

F32_CPU = [("CPU", "float32")]
# A registry like Paddle 3.3.1's CPU wheel: fp32 everywhere, the 16-bit storage ops, no bf16 matmul.
CPU_REGISTRY = {op: list(F32_CPU) for op in COMPUTE_OPS + KV_WRITE_OPS}
CPU_REGISTRY["fused_rms_norm_quant"] = list(F32_CPU)
for op in ("cast", "index_put"):
    CPU_REGISTRY[op] += [("CPU", "bfloat16"), ("CPU", "float16")]
CPU_REGISTRY["index_select"] += [("CPU", "bfloat16")]


def facts(cpuinfo: str, device: str = "cpu", registry: dict | None = None, fallback: bool = True,
          description: str = "", custom_ops=(), cpu_kernels_built: bool = False,
          signatures: dict | None = None) -> PlaceFacts:
    """signatures: {custom op: (ok, detail)}; default: every op of custom_ops has the expected one."""
    if signatures is None:
        signatures = {op: (True, f"{op} signature as expected") for op in custom_ops}
    return PlaceFacts(device=device, cpu=parse_cpuinfo(cpuinfo),
                      registry=KernelRegistry(registry or CPU_REGISTRY, custom_ops=set(custom_ops)),
                      kernel_fallback=fallback, paddle_version="3.3.1", device_description=description,
                      cpu_kernels_built=cpu_kernels_built,
                      cpu_kernels_detail="built" if cpu_kernels_built else "the C++ CPU kernels are not built",
                      op_signatures=signatures)


def kernels_on(**on) -> dict[str, bool]:
    """plan.kernels with every optional kernel off except those given."""
    from paddle_llm_engine.platforms.settings import OPTIONAL_KERNELS

    return {name: bool(on.get(name, False)) for name in OPTIONAL_KERNELS}


class Verifier:
    """Records the checks asked for (calls: names; args: (name, dtype, params)); answers with a fixed verdict."""

    def __init__(self, verdict: ChildVerdict = ChildVerdict(True, "max difference 1e-06")):
        self.verdict, self.calls, self.args = verdict, [], []

    def __call__(self, name, dtype="float32", **params):
        self.calls.append(name)
        self.args.append((name, dtype, params))
        return self.verdict


def test_parse_cpuinfo_reads_model_and_flags():
    epyc = parse_cpuinfo(EPYC_AVX2)
    assert epyc.model == "AMD EPYC 7B13"
    assert epyc.has("avx2", "fma") and not epyc.has("avx512f")
    assert epyc.missing("avx512f", "avx2", "avx512bw") == ["avx512f", "avx512bw"]
    xeon = parse_cpuinfo(XEON_AVX512)
    assert xeon.has("avx512f", "avx2", "fma")
    assert parse_cpuinfo("").flags == frozenset()


def test_avx2_only_cpu_never_runs_the_fused_rms_norm():
    v = Verifier()
    plan = decide(facts(EPYC_AVX2), verify=v)
    assert plan.kernels == kernels_on(cpu_kernels=False, fused_rms_norm=False, fused_moe=False)
    assert v.calls == []  # not even tried in a child: the flags already say no
    assert "fused_rms_norm: off, CPU lacks avx512f" in "\n".join(plan.decisions)
    assert (plan.dtype, plan.kv_cache_dtype) == ("float32", "float32")


def test_avx512_cpu_uses_it_after_the_child_check():
    v = Verifier()
    plan = decide(facts(XEON_AVX512), verify=v)
    assert plan.kernels == kernels_on(cpu_kernels=False, fused_rms_norm=True, fused_moe=False)
    assert v.calls == ["fused_rms_norm"]
    assert "fused_rms_norm: on, CPU has avx512f; verified: max difference 1e-06" in plan.decisions


def test_avx512_cpu_whose_child_check_dies_keeps_the_composed_path():
    v = Verifier(ChildVerdict(False, "the check process died with SIGILL"))
    plan = decide(facts(XEON_AVX512), verify=v)
    assert plan.kernels == kernels_on(cpu_kernels=False, fused_rms_norm=False, fused_moe=False)
    assert "fused_rms_norm: off, verification failed: the check process died with SIGILL" in plan.decisions


def test_old_cpu_and_missing_kernel():
    assert decide(facts(OLD_SSE_ONLY), verify=Verifier()).kernels == kernels_on(cpu_kernels=False, fused_rms_norm=False, fused_moe=False)
    reg = {k: v for k, v in CPU_REGISTRY.items() if k != "fused_rms_norm_quant"}
    plan = decide(facts(XEON_AVX512, registry=reg), verify=Verifier())
    assert plan.kernels == kernels_on(cpu_kernels=False, fused_rms_norm=False, fused_moe=False)
    assert "fused_rms_norm: off, Paddle has no CPU fused_rms_norm_quant kernel for float32" in plan.decisions


def test_operator_forces_the_composed_path():
    v = Verifier()
    plan = decide(facts(XEON_AVX512), kernels="composed", verify=v)
    assert plan.kernels == kernels_on(cpu_kernels=False, fused_rms_norm=False, fused_moe=False) and v.calls == []
    assert "fused_rms_norm: off, kernels set to composed by the operator" in plan.decisions


def test_forced_kernel_the_host_cannot_run_is_refused():
    assert decide(facts(XEON_AVX512), kernels="fused_rms_norm", verify=Verifier()).kernels["fused_rms_norm"]
    with pytest.raises(PlatformError) as ei:
        decide(facts(EPYC_AVX2), kernels="fused_rms_norm", verify=Verifier())
    assert str(ei.value) == ("kernels lists fused_rms_norm, which cpu cannot run: CPU lacks avx512f "
                             "(Paddle's CPU kernel runs AVX-512 unconditionally)")


@pytest.mark.parametrize("bad", ["fused_rms_norn", ";", "fast"])
def test_unknown_kernel_names_are_refused(bad):
    with pytest.raises(ValueError) as ei:
        decide(facts(XEON_AVX512), kernels=bad, verify=Verifier())
    assert "kernels must be 'auto', 'composed' or a ';'-separated list of cpu_kernels, fused_rms_norm, fused_moe" in str(ei.value)


def test_cpu_dtypes():
    plan = decide(facts(EPYC_AVX2), verify=Verifier())
    assert plan.dtype == "float32"
    assert plan.decisions[1].startswith("dtype float32 (auto): the fastest dtype with the CPU kernels for every op")
    assert "no bfloat16: the CPU lacks matmul" in plan.decisions[1]
    for dt in ("bfloat16", "float16"):
        with pytest.raises(PlatformError) as ei:
            decide(facts(EPYC_AVX2), dtype=dt, verify=Verifier())
        assert f"dtype {dt} is not supported on cpu: Paddle has no {dt} kernel on the CPU for matmul" in str(ei.value)


def test_cpu_kv_cache_dtypes_are_storage():
    bf = decide(facts(EPYC_AVX2), kv_cache_dtype="bfloat16", verify=Verifier())
    assert (bf.dtype, bf.kv_cache_dtype, bf.kv_gather_dtype) == ("float32", "bfloat16", "bfloat16")
    fp = decide(facts(EPYC_AVX2), kv_cache_dtype="float16", verify=Verifier())
    assert (fp.kv_cache_dtype, fp.kv_gather_dtype) == ("float16", "bfloat16")  # no fp16 index_select on CPU
    assert "gathered through a bit-identical bfloat16 view" in fp.decisions[2]
    reg = {**CPU_REGISTRY, "index_put": list(F32_CPU)}
    with pytest.raises(PlatformError) as ei:
        decide(facts(EPYC_AVX2, registry=reg), kv_cache_dtype="bfloat16", verify=Verifier())
    assert "kv_cache_dtype bfloat16 is not supported on cpu: no bfloat16 kernel for index_put" in str(ei.value)


@pytest.mark.parametrize("bad", ["fp32", "bf16", "int8", ""])
def test_malformed_dtype_settings(bad):
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16, float16"):
        decide(facts(EPYC_AVX2), dtype=bad, verify=Verifier())


def _gcu_registry(with_bf16: bool, with_fused: bool, with_contiguous: bool) -> dict:
    reg = {k: list(v) for k, v in CPU_REGISTRY.items()}
    if with_bf16:
        for op in set(COMPUTE_OPS) | set(KV_WRITE_OPS):
            reg[op] = reg.get(op, []) + [("gcu", "bfloat16"), ("gcu", "float16"), ("gcu", "float32")]
    if with_fused:
        reg["fused_rms_norm_quant"] += [("gcu", "bfloat16"), ("gcu", "float32")]
    if with_contiguous:
        reg["contiguous"] = [("gcu", "float32"), ("gcu", "bfloat16")]
    return reg


def test_gcu_plugin_with_bf16_kernels_serves_bf16():
    f = facts(EPYC_AVX2, "gcu:1", _gcu_registry(True, True, True), description="gcu:1 through paddle-custom-gcu 3.3.0",
              custom_ops=FUSED_MOE_OPS)
    plan = decide(f, verify=Verifier())
    assert (plan.dtype, plan.kv_cache_dtype) == ("bfloat16", "bfloat16")
    # the plug-in's kernels, whatever the host CPU lacks; never its stub fused_rms_norm even where registered
    assert plan.kernels == kernels_on(cpu_kernels=False, fused_rms_norm=False, fused_moe=True)
    assert plan.flags == {}
    assert plan.decisions[0] == "device: gcu:1 through paddle-custom-gcu 3.3.0"
    assert decide(f, dtype="float32", verify=Verifier()).dtype == "float32"


def test_standin_plugin_without_kernels_gets_fp32_through_the_fallback():
    f = facts(XEON_AVX512, "gcu:0", _gcu_registry(False, False, False),
              description="gcu:0 through paddle-custom-gcu 3.3.1+standin: TEST STAND-IN")
    v = Verifier()
    plan = decide(f, verify=v)
    assert plan.dtype == "float32"
    assert plan.flags == {"FLAGS_use_stride_kernel": False}
    # never the host's AVX-512 kernel
    assert plan.kernels == kernels_on(cpu_kernels=False, fused_rms_norm=False, fused_moe=False) and v.calls == []
    text = "\n".join(plan.decisions)
    assert "TEST STAND-IN" in text
    assert f"float32 runs {len(COMPUTE_OPS)} of {len(COMPUTE_OPS)} ops through Paddle's CPU kernel fallback" in text
    assert ("fused_rms_norm: off, never on a gcu: paddle-custom-gcu registers Paddle's rms_norm / fused_rms_norm "
            "as a stub that computes nothing") in text
    assert "gcu_attention: off, the gcu plug-in registers no flash_attn_var_len_gcu, reshape_and_cache_flash_gcu" in text
    with pytest.raises(PlatformError, match="dtype bfloat16 is not supported on gcu:0"):
        decide(f, dtype="bfloat16", verify=v)
    with pytest.raises(PlatformError, match="has no float32 kernels"):
        decide(facts(XEON_AVX512, "gcu:0", _gcu_registry(False, False, False), fallback=False), verify=v)


def test_fused_moe_is_off_on_the_cpu_and_forcing_it_is_refused():
    v = Verifier()
    plan = decide(facts(XEON_AVX512, custom_ops=FUSED_MOE_OPS), verify=v)  # even with the ops loaded
    assert plan.kernels["fused_moe"] is False
    assert ("fused_moe: off, Paddle has no fused MoE kernel for the CPU; the experts run as grouped matmuls"
            in plan.decisions)
    with pytest.raises(PlatformError, match="kernels lists fused_moe, which cpu cannot run: Paddle has no fused MoE"):
        decide(facts(XEON_AVX512), kernels="fused_moe", verify=v)
    assert decide(facts(XEON_AVX512), kernels="fused_rms_norm", verify=v).kernels == kernels_on(cpu_kernels=False, fused_rms_norm=True, fused_moe=False)


def test_fused_moe_on_a_gcu_follows_the_plugin_ops():
    reg = _gcu_registry(True, True, True)
    on = decide(facts(EPYC_AVX2, "gcu:0", reg, custom_ops=FUSED_MOE_OPS + ("rms_norm_gcu",)), verify=Verifier())
    assert on.kernels["fused_moe"] is True
    assert ("fused_moe: on, the gcu plug-in registers topk_softmax_gcu, moe_align_block_size_gcu, fused_moe_kernel_gcu "
            "with the expected signatures; verified: max difference 1e-06") in on.decisions
    only_align = facts(EPYC_AVX2, "gcu:0", reg, custom_ops=("moe_align_block_size_gcu",))
    off = decide(only_align, verify=Verifier())
    assert off.kernels["fused_moe"] is False
    assert "fused_moe: off, the gcu plug-in registers no topk_softmax_gcu, fused_moe_kernel_gcu" in off.decisions
    with pytest.raises(PlatformError, match="kernels lists fused_moe, which gcu:0 cannot run: the gcu plug-in "
                                            "registers no topk_softmax_gcu, fused_moe_kernel_gcu"):
        decide(only_align, kernels="fused_moe", verify=Verifier())
    composed = decide(facts(EPYC_AVX2, "gcu:0", reg, custom_ops=FUSED_MOE_OPS), kernels="composed", verify=Verifier())
    assert composed.kernels == kernels_on(cpu_kernels=False, fused_rms_norm=False, fused_moe=False)
    assert "fused_moe: off, kernels set to composed by the operator" in composed.decisions


def test_opset_follows_the_fused_moe_decision():
    import inspect

    from paddle_llm_ops.gcu import custom_ops
    from paddle_llm_ops.moe import COMPOSED_MOE, FUSED_GCU_MOE, moe_experts_fused_gcu
    from paddle_llm_ops.opset import build_opset

    called = inspect.getsource(moe_experts_fused_gcu) + inspect.getsource(custom_ops.topk_softmax)
    assert all(f'"{op}"' in called for op in FUSED_MOE_OPS)  # the ops the decision looks for are the ones the kernel calls
    assert build_opset().moe_experts is COMPOSED_MOE
    fused = build_opset(fused_moe=True)
    assert fused.moe_experts is FUSED_GCU_MOE and dict(fused.names)["moe_experts"] == "fused_gcu"


@pytest.mark.parametrize("cpuinfo, isa", [(EPYC_AVX2, "avx2_fma"), (XEON_AVX512, "avx2_fma"),
                                           (ZEN5_VNNI, "avx512_vnni"), (OLD_SSE_ONLY, "generic")])
def test_cpu_kernels_isa_follows_the_flags(cpuinfo, isa):
    v = Verifier()
    plan = decide(facts(cpuinfo, cpu_kernels_built=True), verify=v)
    assert plan.kernels["cpu_kernels"] is True and plan.cpu_isa == isa
    # verified on the path chosen; their own RMSNorm replaces Paddle's fused one (not checked)
    assert v.args == [("cpu_kernels", "float32", {"isa": isa})]
    assert plan.kernels["fused_rms_norm"] is False
    assert "fused_rms_norm: off, the C++ CPU kernels' RMSNorm runs instead" in plan.decisions
    want = {"avx2_fma": "cpu_kernels: on, AVX2+FMA path, the CPU has avx2 and fma",
            "avx512_vnni": "cpu_kernels: on, AVX-512 VNNI path for int8 dot products and AVX2+FMA for the rest, the "
                           "CPU has avx2, fma, avx512f, avx512bw, avx512_vnni",
            "generic": "cpu_kernels: on, portable path, the CPU lacks avx2, fma"}[isa]
    assert want + "; verified: max difference 1e-06" in plan.decisions


@pytest.mark.parametrize("cpuinfo, how", [
    (ZEN5_VNNI, "quantized to int8 in each call, one fp32 scale per row and 32 input channels (llama.cpp's Q8_0 "
                "block); int8 x int8 dot products with int32 sums on AVX-512 VNNI (vpdpbusd)"),
    (XEON_AVX512, "int8 x int8 dot products with int32 sums on AVX2 (vpmaddubsw/vpmaddwd)"),
    (EPYC_AVX2, "int8 x int8 dot products with int32 sums on AVX2 (vpmaddubsw/vpmaddwd)"),
    (OLD_SSE_ONLY, "fp32, weight-only int8 GEMV (the portable path"),
])
def test_wint8_path_follows_the_cpu_flags(cpuinfo, how):
    plan = decide(facts(cpuinfo, cpu_kernels_built=True), verify=Verifier(), quantization="wint8")
    line = next(d for d in plan.decisions if d.startswith("wint8 activations: "))
    assert how in line, line
    assert plan.decisions[-1].startswith("quantization wint8: ")
    # the linears follow the isa: int8 activations on the vector isas, fp32 on the portable path
    from paddle_llm_ops.linear import Int8Linear

    lin = Int8Linear(np.ones((64, 8), np.float32), None, plan.cpu_isa)
    assert lin.activations == ("fp32" if plan.cpu_isa == "generic" else "int8")


@pytest.mark.parametrize("cpuinfo, how", [
    (ZEN5_VNNI, "int4 x int8 dot products with int32 sums on AVX-512 VNNI (vpdpbusd)"),
    (XEON_AVX512, "fp32, weight-only int4 GEMV"),  # AVX-512 without VNNI
    (EPYC_AVX2, "fp32, weight-only int4 GEMV"),
    (OLD_SSE_ONLY, "fp32, weight-only int4 GEMV"),
])
def test_wint4_path_follows_the_cpu_flags(cpuinfo, how):
    plan = decide(facts(cpuinfo, cpu_kernels_built=True), verify=Verifier(), quantization="wint4",
                  quantization_group_size=64)
    line = next(d for d in plan.decisions if d.startswith("wint4 activations: "))
    assert how in line, line
    assert plan.decisions[-1].startswith("quantization wint4: ")
    from paddle_llm_ops.linear import Int4Linear

    lin = Int4Linear(np.ones((64, 8), np.float32), None, plan.cpu_isa, 64)
    assert lin.kind == ("w4a8" if plan.cpu_isa == "avx512_vnni" else "int4")


def test_cpu_kernels_off_where_they_cannot_serve():
    assert decide(facts(EPYC_AVX2), verify=Verifier()).cpu_isa is None
    assert ("cpu_kernels: off, not available: the C++ CPU kernels are not built"
            in decide(facts(EPYC_AVX2), verify=Verifier()).decisions)
    bf16_compute = {op: list(F32_CPU) + [("CPU", "bfloat16")] for op in CPU_REGISTRY}
    bf = decide(facts(EPYC_AVX2, registry=bf16_compute, cpu_kernels_built=True), verify=Verifier())
    assert bf.dtype == "bfloat16" and bf.cpu_isa is None
    assert ("cpu_kernels: off, they need float32 compute and a float32, bfloat16 or float16 KV cache "
            "(dtype bfloat16, kv_cache_dtype bfloat16)") in bf.decisions
    gcu = decide(facts(EPYC_AVX2, "gcu:0", _gcu_registry(True, True, True), cpu_kernels_built=True), verify=Verifier())
    assert gcu.cpu_isa is None and gcu.kernels["cpu_kernels"] is False
    composed = decide(facts(EPYC_AVX2, cpu_kernels_built=True), kernels="composed", verify=Verifier())
    assert composed.cpu_isa is None
    with pytest.raises(PlatformError, match="kernels lists cpu_kernels, which cpu cannot run: not available"):
        decide(facts(EPYC_AVX2), kernels="cpu_kernels", verify=Verifier())


@pytest.mark.parametrize("cpuinfo,isa", [(ZEN5_VNNI, "avx512_vnni"), (EPYC_AVX2, "avx2_fma"),
                                         (OLD_SSE_ONLY, "generic")])
def test_cpu_kernels_serve_a_16bit_kv_cache_and_auto_stays_float32(cpuinfo, isa):
    auto = decide(facts(cpuinfo, cpu_kernels_built=True), verify=Verifier())
    assert (auto.kv_cache_dtype, auto.cpu_isa) == ("float32", isa)  # 16-bit is the operator's choice
    for kv in ("bfloat16", "float16"):
        plan = decide(facts(cpuinfo, cpu_kernels_built=True), kv_cache_dtype=kv, verify=Verifier())
        assert (plan.dtype, plan.kv_cache_dtype, plan.cpu_isa) == ("float32", kv, isa)
        assert plan.kv_gather_dtype == "bfloat16"  # the composed prefill's gather (no float16 index_select)
        assert plan.opset(64).make_decode_stack is not None


def test_this_host_plan_follows_its_cpu_flags(caplog):
    from paddle_llm_ops import cpu_kernels

    cpu = cpu_features.host_cpu()
    with caplog.at_level(logging.INFO, logger="paddle_llm_engine.platforms.plan"):
        plan = plan_for_device("cpu")
        composed = plan_for_device("cpu", kernels="composed")
        rms_only = plan_for_device("cpu", kernels="fused_rms_norm") if cpu.has("avx512f") else None
    assert plan.dtype == "float32"
    assert cpu_kernels.available(), "set-up builds the C++ CPU kernels"
    assert plan.kernels["cpu_kernels"] is True
    vnni = cpu.has("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni")
    assert plan.cpu_isa == ("avx512_vnni" if vnni else "avx2_fma" if cpu.has("avx2", "fma") else "generic")
    assert plan.kv_cache_dtype == "float32"
    assert composed.kernels == kernels_on(cpu_kernels=False, fused_rms_norm=False, fused_moe=False)
    if not cpu.has("avx512f"):
        with pytest.raises(PlatformError, match="CPU lacks avx512f"):
            plan_for_device("cpu", kernels="fused_rms_norm")
    else:
        assert rms_only.kernels["fused_rms_norm"] is True, caplog.text
        assert "fused_rms_norm: on, CPU has avx512f" in caplog.text


def test_engine_on_simulated_hosts_picks_kernels_from_flags_and_logs_why(tiny_model_dir, monkeypatch, caplog):
    """The engine with this host's flags replaced by the EPYC's (AVX2, no AVX-512): the C++ kernels'
    AVX2 path, or without them the composed RMSNorm, chosen before any op runs; with an SSE-only CPU's
    flags the kernels' portable path. Greedy tokens equal those of an engine with this host's choice."""
    from paddle_llm_engine import SamplingParams

    kw = dict(model_dir=tiny_model_dir, device="cpu", num_kv_blocks=16, block_size=16, max_model_len=128)
    prompts = [[5, 6, 7, 8, 9], list(range(20, 61))]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    def run(engine):
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, params)
        toks = {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                toks.setdefault(o.request_id, []).extend(o.token_ids)
        return toks

    native = LLMEngine(EngineConfig(**kw))
    want = run(native)
    monkeypatch.setattr(cpu_features, "host_cpu", lambda: parse_cpuinfo(EPYC_AVX2))
    with caplog.at_level(logging.INFO, logger="paddle_llm_engine.platforms.plan"):
        simulated = LLMEngine(EngineConfig(**kw))
    assert "platform cpu: cpu_kernels: on, AVX2+FMA path, the CPU has avx2 and fma" in caplog.text
    assert "platform cpu: fused_rms_norm: off, the C++ CPU kernels' RMSNorm runs instead" in caplog.text
    assert dict(simulated.executor.worker.ops.names)["rms_norm"] == "cpu_avx2_fma"
    assert run(simulated) == want
    # the same host where the C++ kernels are not built: Paddle's composed ops, never its AVX-512 kernel
    from paddle_llm_ops import cpu_kernels

    def not_built():
        raise cpu_kernels.KernelsNotBuiltError("not built in this test")

    monkeypatch.setattr(cpu_kernels, "load", not_built)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="paddle_llm_engine.platforms.plan"):
        bare = LLMEngine(EngineConfig(**kw))
    assert "platform cpu: fused_rms_norm: off, CPU lacks avx512f" in caplog.text
    assert "platform cpu: cpu_kernels: off, not available: not built in this test" in caplog.text
    assert dict(bare.executor.worker.ops.names)["rms_norm"] == "composed"
    assert run(bare) == want
    # an old CPU without AVX2: the kernels' portable path
    monkeypatch.undo()
    monkeypatch.setattr(cpu_features, "host_cpu", lambda: parse_cpuinfo(OLD_SSE_ONLY))
    generic = LLMEngine(EngineConfig(**kw))
    assert dict(generic.executor.worker.ops.names)["linear"] == "cpu_gemv_generic"
    assert run(generic) == want
    monkeypatch.setattr(cpu_features, "host_cpu", lambda: parse_cpuinfo(EPYC_AVX2))
    with pytest.raises(PlatformError, match="kernels lists fused_rms_norm, which cpu cannot run: CPU lacks avx512f"):
        LLMEngine(EngineConfig(**kw, kernels="fused_rms_norm"))


# -- paddle-custom-gcu's fast ops (gcu_attention, gcu_rotary, gcu_rms_norm, fused_moe) -----------------
GCU_OPS = ("flash_attn_var_len_gcu", "reshape_and_cache_flash_gcu", "fused_rotary_embedding_gcu", "rms_norm_gcu",
           "fused_add_rms_norm_op") + FUSED_MOE_OPS
GCU_KERNELS = ("gcu_attention", "gcu_rotary", "gcu_rms_norm", "fused_moe")


class NamedVerifier(Verifier):
    """Fails the checks named in `failing` with a difference; passes the others."""

    def __init__(self, failing=()):
        super().__init__()
        self.failing = set(failing)

    def __call__(self, name, dtype="float32", **params):
        self.calls.append(name)
        if name in self.failing:
            return ChildVerdict(False, f"{name} differs from the composed ops by 3.1 (max |composed| 2.0)")
        return ChildVerdict(True, "max difference 2e-07")


def gcu_facts(custom_ops=GCU_OPS, signatures=None, registry=None) -> PlaceFacts:
    return facts(EPYC_AVX2, "gcu:0", registry or _gcu_registry(True, False, True),
                 description="gcu:0 through paddle-custom-gcu 3.3.0", custom_ops=custom_ops, signatures=signatures)


def test_gcu_with_every_op_turns_each_kernel_on_after_its_check():
    v = NamedVerifier()
    plan = decide(gcu_facts(), verify=v)
    assert plan.dtype == "bfloat16"  # the registry has bf16 kernels on the device
    assert plan.kernels == kernels_on(**{k: True for k in GCU_KERNELS})
    assert sorted(v.calls) == sorted(GCU_KERNELS)  # each checked on the place before it is on
    text = "\n".join(plan.decisions)
    assert ("gcu_attention: on, the gcu plug-in registers flash_attn_var_len_gcu, reshape_and_cache_flash_gcu with "
            "the expected signatures; one call per layer, KV cache paged [num_blocks, block_size, kv_heads, "
            "head_dim]; verified: max difference 2e-07") in text
    assert "gcu_rms_norm: on, the gcu plug-in registers rms_norm_gcu, fused_add_rms_norm_op" in text
    assert "fused_rms_norm: off, never on a gcu" in text and plan.kernels["fused_rms_norm"] is False


def test_gcu_missing_op_turns_off_its_whole_unit_only():
    v = NamedVerifier()
    no_cache = tuple(op for op in GCU_OPS if op != "reshape_and_cache_flash_gcu")
    plan = decide(gcu_facts(no_cache), verify=v)
    # attention and the KV write are one unit: without the write, the flash attention is off too
    assert plan.kernels == kernels_on(gcu_rotary=True, gcu_rms_norm=True, fused_moe=True)
    assert "gcu_attention" not in v.calls
    assert ("gcu_attention: off, the gcu plug-in registers no reshape_and_cache_flash_gcu; the composed attention "
            "over the [kv_heads, slots, head_dim] cache runs") in plan.decisions
    with pytest.raises(PlatformError, match="kernels lists gcu_attention, which gcu:0 cannot run: the gcu plug-in "
                                            "registers no reshape_and_cache_flash_gcu"):
        decide(gcu_facts(no_cache), kernels="gcu_attention", verify=v)


def test_gcu_mismatched_signature_turns_the_kernel_off_naming_both_signatures():
    from paddle_llm_ops.gcu import signatures as sg

    wrong = sg.OpSignature(sg.EXPECTED["flash_attn_var_len_gcu"].inputs, ("attention_out",),
                           tuple(a for a in sg.EXPECTED["flash_attn_var_len_gcu"].attrs if not a.startswith("softcap"))
                           + ("head_size: int",))
    sigs = {op: sg.compare(op, sg.EXPECTED[op]) for op in GCU_OPS}
    sigs["flash_attn_var_len_gcu"] = sg.compare("flash_attn_var_len_gcu", wrong)
    assert sigs["reshape_and_cache_flash_gcu"][0] and not sigs["flash_attn_var_len_gcu"][0]
    v = NamedVerifier()
    plan = decide(gcu_facts(signatures=sigs), verify=v)
    assert plan.kernels["gcu_attention"] is False and "gcu_attention" not in v.calls
    assert plan.kernels["gcu_rotary"] and plan.kernels["gcu_rms_norm"]
    line = next(d for d in plan.decisions if d.startswith("gcu_attention: off"))
    assert "flash_attn_var_len_gcu signature differs: registered (query, key, value" in line
    assert "head_size: int" in line and "softcap: float, return_softmax: bool" in line  # both signatures named


def test_gcu_failed_check_turns_the_kernel_off_with_the_difference():
    v = NamedVerifier(failing={"gcu_rms_norm", "gcu_attention"})
    plan = decide(gcu_facts(), verify=v)
    assert plan.kernels == kernels_on(gcu_rotary=True, fused_moe=True)
    assert ("gcu_rms_norm: off, verification failed: gcu_rms_norm differs from the composed ops by 3.1 "
            "(max |composed| 2.0)") in plan.decisions
    assert any(d.startswith("gcu_attention: off, verification failed:") for d in plan.decisions)


def test_gcu_attention_needs_the_cache_in_the_compute_dtype_and_a_gcu_place():
    plan = decide(gcu_facts(), kv_cache_dtype="float16", verify=NamedVerifier())
    assert plan.kernels["gcu_attention"] is False and plan.kernels["gcu_rms_norm"] is True
    assert ("gcu_attention: off, flash_attn_var_len_gcu reads the cache in the compute dtype; kv_cache_dtype float16 "
            "differs from dtype bfloat16") in plan.decisions
    cpu = decide(facts(XEON_AVX512, custom_ops=GCU_OPS), verify=NamedVerifier())  # ops loaded, CPU place
    assert not any(cpu.kernels[k] for k in GCU_KERNELS)
    composed = decide(gcu_facts(), kernels="composed", verify=NamedVerifier())
    assert composed.kernels == kernels_on()


def test_signature_compare_reads_a_registered_custom_op_proto_and_never_raises():
    """registered_signature reads Paddle's op proto and in-place map: checked on a custom op this
    process can load without a plug-in (the C++ CPU kernels' plk_rotary_kv, with optional inputs and
    an in-place map), and on names that are not registered."""
    from paddle_llm_ops import cpu_kernels
    from paddle_llm_ops.gcu import signatures as sg

    cpu_kernels.load()
    got = sg.registered_signature("plk_rotary_kv")
    assert got.inputs == ("Qkv", "Positions", "Cos", "Sin", "KCache", "VCache", "SlotMapping", "Optional(QNorm)",
                          "Optional(KNorm)")
    assert got.outputs == ("QOut", "KCacheOut", "VCacheOut")
    assert got.attrs == ("num_heads: int", "num_kv_heads: int", "eps: float", "isa: std::string")
    assert got.inplace == (("KCache", "KCacheOut"), ("VCache", "VCacheOut"))
    assert sg.registered_signature("flash_attn_var_len_gcu") is None
    assert sg.compare("flash_attn_var_len_gcu") == (False, "flash_attn_var_len_gcu is not registered")
    assert sg.compare("no_such_op")[0] is False
    newer = sg.ROTARY_WITH_HEAD_SIZE
    assert sg.compare("fused_rotary_embedding_gcu", newer)[0]  # both wheel variants are accepted
    moved = sg.OpSignature(("key_cache", "value_cache", "key", "value", "slot_mapping"),
                           ("key_cache_out", "value_cache_out"), (),
                           (("key_cache", "key_cache_out"), ("value_cache", "value_cache_out")))
    ok, detail = sg.compare("reshape_and_cache_flash_gcu", moved)
    assert not ok and "registered (key_cache, value_cache, key, value, slot_mapping)" in detail
