"""The platform plan's quantization decisions (wint8 / wint4, quantization_group_size) and the
settings' validation, for hosts we do not have (facts and verifier fakes of test_platform_plan)."""

from __future__ import annotations

import pytest

from paddle_llm_engine import EngineConfig
from paddle_llm_engine.platforms import PlatformError, check_settings, decide
from paddle_llm_engine.platforms.kernel_checks import ChildVerdict
from paddle_llm_engine.platforms.settings import check_prefill_activations
from test_platform_plan import EPYC_AVX2, XEON_AVX512, ZEN5_VNNI, Verifier, _gcu_registry, facts


@pytest.mark.parametrize("quantization,group,bits,groups_text", [
    ("wint8", 0, 8, "output channel"), ("wint4", 0, 4, "group of 64 input channels"),
    ("wint4", -1, 4, "output channel"), ("wint8", 128, 8, "group of 128 input channels")])
def test_cpu_quantization_runs_on_the_cpp_gemv(quantization, group, bits, groups_text):
    plan = decide(facts(EPYC_AVX2, cpu_kernels_built=True), quantization=quantization,
                  quantization_group_size=group, verify=Verifier())
    assert plan.quantization == quantization and plan.cpu_isa == "avx2_fma"
    assert plan.quantization_group_size == {0: -1 if bits == 8 else 64}.get(group, group)
    assert plan.decisions[-1] == (f"quantization {quantization}: weight-only symmetric int{bits}, one scale per "
                                  f"{groups_text} (fp32 scales), C++ int{bits} GEMV (avx2_fma) for every linear and "
                                  f"the LM head")


def test_cpu_quantization_needs_the_cpp_kernels():
    with pytest.raises(PlatformError, match=r"quantization wint4 on the CPU runs on the C\+\+ int4 GEMV, but the C\+\+ "
                                            r"CPU kernels are off \(set to composed by the operator\)"):
        decide(facts(EPYC_AVX2, cpu_kernels_built=True), kernels="composed", quantization="wint4", verify=Verifier())


def _gcu_facts(registered: bool = True, signature_ok: bool = True):
    ops = ("linear_quant_gcu",) if registered else ()
    sigs = {"linear_quant_gcu": (signature_ok, "linear_quant_gcu: registered (lhs, rhs) [] expected ...")}
    return facts(XEON_AVX512, "gcu:0", _gcu_registry(True, True, True), custom_ops=ops, signatures=sigs)


@pytest.mark.parametrize("quantization,bits", [("wint8", 8), ("wint4", 4)])
def test_gcu_quantization_runs_on_linear_quant_gcu_after_its_check(quantization, bits):
    verifier = Verifier()
    plan = decide(_gcu_facts(), quantization=quantization, verify=verifier)
    group = -1 if bits == 8 else 64
    assert plan.quantization == quantization and plan.quantization_group_size == group
    assert ("gcu_linear_quant", "bfloat16", {"bits": bits, "group_size": group}) in verifier.args
    assert "linear_quant_gcu for every linear and the LM head" in plan.decisions[-1]
    assert "weight_only_linear" not in " ".join(plan.decisions)


def test_gcu_quantization_refused_without_a_working_linear_quant_gcu():
    with pytest.raises(PlatformError, match="quantization wint8 is not supported on gcu:0: it runs through "
                                            "paddle-custom-gcu's linear_quant_gcu, and the gcu plug-in registers no "
                                            "linear_quant_gcu"):
        decide(_gcu_facts(registered=False), quantization="wint8", verify=Verifier())
    with pytest.raises(PlatformError, match="linear_quant_gcu: registered"):
        decide(_gcu_facts(signature_ok=False), quantization="wint4", verify=Verifier())
    bad = Verifier(ChildVerdict(False, "max |kernel - composed| 3.1 > 0.02 x max(1, 4.2) (bfloat16)"))
    with pytest.raises(PlatformError, match=r"verification failed: max \|kernel - composed\| 3.1"):
        decide(_gcu_facts(), quantization="wint4", verify=bad)
    with pytest.raises(PlatformError, match="quantization_group_size 32 is not supported on gcu:0: paddle-custom-gcu's "
                                            "linear_quant_gcu takes -1, 64 or 128"):
        decide(_gcu_facts(), quantization="wint4", quantization_group_size=32, verify=Verifier())


@pytest.mark.parametrize("value", [3, 12, -2, 100, 1.5, "64", True])
def test_group_size_setting_validated_naming_it(value):
    with pytest.raises(ValueError, match="quantization_group_size must be 0 .* or a positive multiple of 8"):
        check_settings("auto", "auto", "wint4", value)


def test_quantization_setting_validated_naming_it():
    with pytest.raises(ValueError, match="quantization must be empty, wint8 or wint4; got 'int4'"):
        decide(facts(EPYC_AVX2), quantization="int4", verify=Verifier())
    assert check_settings("auto", "auto", "wint4", 0) == 64
    assert check_settings("auto", "auto", "wint8", 0) == -1
    assert check_settings("auto", "auto", "", 0) == -1


def test_group_size_that_does_not_divide_a_linear_is_refused_at_load(tiny_model_dir):
    from paddle_llm_engine import LLMEngine

    with pytest.raises(ValueError, match="quantization_group_size 40 does not fit a linear of input width"):
        LLMEngine(EngineConfig(model_dir=tiny_model_dir, device="cpu", num_kv_blocks=16, block_size=16,
                               quantization="wint4", quantization_group_size=40))


# wint8_prefill_activations: the decision for hosts this one may not be (the int8 GEMM is VNNI code)
@pytest.mark.parametrize("cpu,asked,on,line", [
    (ZEN5_VNNI, "int8", True, "wint8 prefill activations: int8 (wint8_prefill_activations int8): every step's rows "
                              "run the int8 GEMM, activations quantized per row and block of 32"),
    (EPYC_AVX2, "int8", False, "wint8 prefill activations: fp32, although int8 was asked: the int8 GEMM is AVX-512 "
                               "VNNI code for the C++ CPU kernels, and they run avx2_fma here"),
    (ZEN5_VNNI, "fp32", False, None), (EPYC_AVX2, "fp32", False, None)])
def test_wint8_prefill_activations_decided_per_host(cpu, asked, on, line):
    plan = decide(facts(cpu, cpu_kernels_built=True), quantization="wint8", wint8_prefill_activations=asked,
                  verify=Verifier())
    assert plan.w8a8_prefill is on
    found = [d for d in plan.decisions if d.startswith("wint8 prefill activations")]
    assert found == ([line] if line else [])
    assert plan.decisions[-1].startswith("quantization wint8: ")  # still the last line
    names = dict(plan.opset(16).names)
    assert names["wint8_prefill"] == ("int8" if on else "fp32")


def test_wint8_prefill_activations_on_a_gcu_is_noted_not_applied():
    plan = decide(_gcu_facts(), quantization="wint8", wint8_prefill_activations="int8", verify=Verifier())
    assert plan.w8a8_prefill is False
    assert any(d.startswith("wint8 prefill activations: not applied on gcu") for d in plan.decisions)


@pytest.mark.parametrize("value,quantization,message", [
    ("int4", "wint8", "wint8_prefill_activations must be fp32 or int8; got 'int4'"),
    ("int8", "", "wint8_prefill_activations int8 needs quantization wint8"),
    ("int8", "wint4", "wint8_prefill_activations int8 needs quantization wint8")])
def test_wint8_prefill_activations_setting_validated_naming_it(value, quantization, message):
    with pytest.raises(ValueError, match=message):
        check_prefill_activations(value, quantization)
    with pytest.raises(ValueError, match=message):  # the engine's own check (before any weight is read)
        decide(facts(ZEN5_VNNI, cpu_kernels_built=True), quantization=quantization, wint8_prefill_activations=value,
               verify=Verifier())
