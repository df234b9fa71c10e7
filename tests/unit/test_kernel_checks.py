"""The kernel verification framework: checks registered in paddle_llm_ops.kernel_checks, run and
judged by paddle_llm_engine.platforms.kernel_checks, called by the platform plan for every optional
kernel it is about to turn on. Fake checks (kernel_check_fakes.py) stand for kernels this host does
not have (a stub that returns garbage, one that dies with SIGILL or abort); the real checks of the
C++ CPU kernels and of Paddle's fused_rms_norm run on this host."""

from __future__ import annotations

import logging
import math
import re
import signal
import time

import numpy as np
import pytest

import kernel_check_fakes as fakes
from paddle_llm_engine.platforms import KernelRegistry, PlaceFacts, PlatformError, cpu_features, decide, parse_cpuinfo
from paddle_llm_engine.platforms import kernel_checks as kc
from paddle_llm_engine.platforms.process_plan import plan_for_device
from paddle_llm_ops import kernel_checks as registry
from test_platform_plan import CPU_REGISTRY, EPYC_AVX2, XEON_AVX512

ON = ("cpu_kernels", "fused_rms_norm")


@pytest.fixture
def cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PADDLE_LLM_CACHE_DIR", str(tmp_path))
    return tmp_path


def fake(monkeypatch, name: str, fn, isolate: bool = False, build_id=None):
    """Register `fn` as the check of kernel `name` for this test only."""
    registry.load_checks()
    monkeypatch.setitem(registry.CHECKS, name, fn)
    if isolate:
        monkeypatch.setattr(registry, "ISOLATED", registry.ISOLATED | {name})
    else:
        monkeypatch.setattr(registry, "ISOLATED", registry.ISOLATED - {name})
    if build_id is not None:
        monkeypatch.setitem(registry.BUILD_IDS, name, build_id)


def cpu_facts(cpuinfo: str = EPYC_AVX2, cpu_kernels_built: bool = True) -> PlaceFacts:
    return PlaceFacts(device="cpu", cpu=parse_cpuinfo(cpuinfo), registry=KernelRegistry(CPU_REGISTRY, custom_ops=set()),
                      paddle_version="3.3.1", cpu_kernels_built=cpu_kernels_built,
                      cpu_kernels_detail="built" if cpu_kernels_built else "not built in this test")


# -- judging ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 2e-2), ("float16", 5e-3)])
def test_relative_tolerance_per_dtype(dtype, tol):
    assert kc.TOLERANCES[dtype] == tol
    # relative above 1 ...
    assert kc.judge(tol * 50.0, 50.0, dtype).ok
    assert not kc.judge(tol * 50.0 * 1.01, 50.0, dtype).ok
    # ... absolute below 1
    assert kc.judge(tol, 0.01, dtype).ok and not kc.judge(tol * 1.01, 0.01, dtype).ok
    assert not kc.judge(math.nan, 1.0, dtype).ok and not kc.judge(math.inf, 1.0, dtype).ok
    bad = kc.judge(0.5, 2.0, dtype, "rms_norm")
    assert bad.detail == f"rms_norm: max |kernel - composed| 0.5 > {tol:g} x max(1, 2) ({dtype})"
    # the float32 bound refuses what bfloat16's accepts
    assert kc.judge(1e-3, 1.0, "bfloat16").ok and not kc.judge(1e-3, 1.0, "float32").ok


def test_difference_and_worst_part():
    ref = np.array([[1.0, -4.0], [2.0, 0.5]], np.float32)
    assert registry.difference(ref + np.float32(0.25), ref) == (0.25, 4.0)
    nan = ref.copy()
    nan[0, 0] = np.nan
    assert registry.difference(nan, ref)[0] == math.inf
    with pytest.raises(ValueError, match=r"shape \[4\], the composed ops' \[2, 2\]"):
        registry.difference(ref.reshape(-1), ref)
    # 0.5 on a scale of 100 is better than 0.01 on a scale of 0.1 (relative to max(1, ref))
    assert registry.worst({"big": (0.5, 100.0), "small": (0.01, 0.1)}) == (0.01, 0.1, "small")


# -- in-process checks --------------------------------------------------------------------------------
def test_a_correct_kernel_passes_and_garbage_or_nan_fails(monkeypatch):
    fake(monkeypatch, "good", fakes.agrees)
    fake(monkeypatch, "stub", fakes.garbage)
    fake(monkeypatch, "nan", fakes.nan_output)
    fake(monkeypatch, "raises", fakes.raises)
    good = kc.run_check("good", "float32")
    assert good.ok and good.detail.startswith("max |kernel - composed| ") and not good.cached
    diff, ref = fakes.agrees("float32")
    assert 0 < diff < 1e-5 and ref > 1  # it really differs (float32 rounding), within tolerance
    stub = kc.run_check("stub", "float32")
    assert not stub.ok and stub.detail.startswith("max |kernel - composed| 3.1e+07 > 0.0001")
    assert not kc.run_check("nan", "float32").ok
    assert kc.run_check("raises", "bfloat16") == kc.ChildVerdict(
        False, "the check raised RuntimeError: kernel 'rms_norm_gcu' is not registered for gcu")
    assert kc.run_check("no_such_kernel", "float32").detail == "the check raised KeyError: 'no_such_kernel'"


def test_decide_turns_a_garbage_kernel_off_with_the_reason_logged(monkeypatch, caplog):
    fake(monkeypatch, "cpu_kernels", fakes.garbage)
    fake(monkeypatch, "fused_rms_norm", fakes.agrees)
    verify = kc.PlaceVerifier(on_cpu=False)  # no cache: the fakes run now
    plan = decide(cpu_facts(XEON_AVX512), verify=verify)
    assert plan.kernels["cpu_kernels"] is False and plan.cpu_isa is None
    with caplog.at_level(logging.INFO, logger="paddle_llm_engine.platforms.plan"):
        plan.log()
    assert ("platform cpu: cpu_kernels: off, verification failed: max |kernel - composed| 3.1e+07 > 0.0001 x max(1, "
            in caplog.text)
    # with the C++ kernels off, Paddle's fused RMSNorm is considered (and checked) instead
    assert [n for n, _, _ in verify.timings] == ["cpu_kernels", "fused_rms_norm"] and plan.kernels["fused_rms_norm"]
    # forced, the failing kernel is refused with the same reason
    with pytest.raises(PlatformError, match=r"kernels lists cpu_kernels, which cpu cannot run: verification failed: "
                                            r"max \|kernel - composed\| 3.1e\+07"):
        decide(cpu_facts(), kernels="cpu_kernels", verify=kc.PlaceVerifier(on_cpu=False))


def test_decide_turns_a_correct_kernel_on_and_a_raising_verifier_off(monkeypatch):
    fake(monkeypatch, "cpu_kernels", fakes.agrees)
    plan = decide(cpu_facts(), verify=kc.PlaceVerifier(on_cpu=False))
    assert plan.kernels["cpu_kernels"] is True and plan.cpu_isa == "avx2_fma"
    line = next(d for d in plan.decisions if d.startswith("cpu_kernels:"))
    assert line.startswith("cpu_kernels: on, AVX2+FMA path, the CPU has avx2 and fma; verified: max |kernel - composed| ")

    def broken_verifier(name, dtype, **params):
        raise OSError("cache folder unreadable")

    off = decide(cpu_facts(), verify=broken_verifier)
    assert off.kernels["cpu_kernels"] is False
    assert "cpu_kernels: off, verification failed: the check raised OSError: cache folder unreadable" in off.decisions


# -- the cache ----------------------------------------------------------------------------------------
def test_cpu_verdicts_are_cached_per_paddle_cpu_and_library_build(monkeypatch, cache_dir):
    runs = []
    build = ["lib-aaaa"]

    def counted(dtype, isa="generic"):
        runs.append((dtype, isa))
        return 1e-7, 2.0

    fake(monkeypatch, "counted", counted, build_id=lambda: build[0])
    cpu = parse_cpuinfo(EPYC_AVX2)
    v = kc.PlaceVerifier(True, "3.3.1", cpu.model, cpu.flags)
    first = v("counted", "float32", isa="avx2_fma")
    assert first.ok and not first.cached and runs == [("float32", "avx2_fma")]
    again = v("counted", "float32", isa="avx2_fma")
    assert again == kc.ChildVerdict(True, first.detail, cached=True) and len(runs) == 1
    assert [c for _, _, c in v.timings] == [False, True]
    # another isa, Paddle, CPU or library build is checked again
    v("counted", "float32", isa="generic")
    kc.PlaceVerifier(True, "3.3.2", cpu.model, cpu.flags)("counted", "float32", isa="avx2_fma")
    other = parse_cpuinfo(XEON_AVX512)
    kc.PlaceVerifier(True, "3.3.1", other.model, other.flags)("counted", "float32", isa="avx2_fma")
    build[0] = "lib-bbbb"
    v("counted", "float32", isa="avx2_fma")
    assert len(runs) == 5
    assert v("counted", "float32", isa="avx2_fma").cached and len(runs) == 5
    # a device's checks are never cached
    device = kc.PlaceVerifier(False)
    device("counted", "float32")
    device("counted", "float32")
    assert len(runs) == 7


def test_failures_are_cached_but_timeouts_are_not(monkeypatch, cache_dir):
    fake(monkeypatch, "stub", fakes.garbage)
    v = kc.PlaceVerifier(True, "3.3.1", "cpu", {"avx2"})
    assert not v("stub").ok and v("stub") == kc.ChildVerdict(False, v("stub").detail, cached=True)
    fake(monkeypatch, "slow", fakes.agrees)
    monkeypatch.setattr(kc, "run_check", lambda name, dtype, **p: kc.ChildVerdict(
        False, "the check did not finish within 300 s (in a child process)"))
    assert not v("slow").cached and not v("slow").cached  # asked again at the next start
    # an unwritable cache only costs the check at each start
    monkeypatch.setenv("PADDLE_LLM_CACHE_DIR", "/proc/no_such_dir")
    assert not v("stub").cached


# -- the child process ----------------------------------------------------------------------------
@pytest.mark.parametrize("fn, what", [(fakes.dies_with_sigill, signal.SIGILL.name), (fakes.aborts, signal.SIGABRT.name)])
def test_a_kernel_that_kills_its_process_is_run_in_a_child_and_turned_off(monkeypatch, cache_dir, fn, what):
    fake(monkeypatch, "fused_rms_norm", fn, isolate=True)
    t0 = time.monotonic()
    verify = kc.PlaceVerifier(True, "3.3.1", "cpu", {"avx512f"})
    plan = decide(cpu_facts(XEON_AVX512, cpu_kernels_built=False), verify=verify)
    assert plan.kernels["fused_rms_norm"] is False
    assert f"fused_rms_norm: off, verification failed: the check process died with {what}" in plan.decisions, \
        plan.decisions
    assert time.monotonic() - t0 < 120  # the parent survives and goes on
    with pytest.raises(PlatformError, match=f"kernels lists fused_rms_norm, which cpu cannot run: verification failed: "
                                            f"the check process died with {what}"):
        decide(cpu_facts(XEON_AVX512, cpu_kernels_built=False), kernels="fused_rms_norm", verify=verify)
    assert verify.timings[-1][2] is True  # the second start read the verdict from the cache


@pytest.mark.slow
def test_child_results_pass_raise_and_are_judged_in_the_parent(monkeypatch):
    fake(monkeypatch, "good", fakes.agrees, isolate=True)
    fake(monkeypatch, "raises", fakes.raises, isolate=True)
    good = kc.run_in_child("good", "float32", scale=3.0)
    assert good.ok and good.detail.endswith("(float32) (in a child process)")
    assert kc.run_in_child("raises", "float32").detail == (
        "the check raised RuntimeError: kernel 'rms_norm_gcu' is not registered for gcu (in a child process)")
    fake(monkeypatch, "stub", fakes.garbage, isolate=True)
    assert not kc.run_in_child("stub", "float16").ok


# -- the real checks on this host -----------------------------------------------------------------------
@pytest.mark.parametrize("isa", ["avx2_fma", "generic"])
def test_the_cpu_kernels_check_passes_on_this_host(isa):
    from paddle_llm_ops import cpu_kernels

    if isa not in cpu_kernels.supported_isas():
        # the other kind of host: the path this CPU lacks either refuses or dies, and only in a child;
        # never a passing verdict (the plan does not pick it: test_platform_plan)
        verdict = kc.run_in_child("cpu_kernels", "float32", isa=isa)
        assert not verdict.ok and verdict.detail.endswith("(in a child process)"), verdict.detail
        return
    verdict = kc.run_check("cpu_kernels", "float32", isa=isa)
    assert verdict.ok, verdict.detail
    diff, ref, part = registry.CHECKS["cpu_kernels"]("float32", isa=isa)
    assert 0 <= diff <= 1e-4 * max(1.0, ref) and ref > 1
    assert not kc.run_check("cpu_kernels", "bfloat16", isa=isa).ok  # float32 only


def test_the_cpu_kernels_check_catches_a_broken_op(monkeypatch):
    """The real check, with one op of the library replaced by a wrong one: a decode attention
    that ignores the last token of each sequence, then an RMSNorm without its weight."""
    from paddle_llm_ops import cpu_kernels

    real = cpu_kernels.paged_decode_attention

    def drops_last(q, k, v, tables, lens, scale, block_size, isa):
        return real(q, k, v, tables, (lens - 1).clip(min=1), scale, block_size, isa)

    monkeypatch.setattr(cpu_kernels, "paged_decode_attention", drops_last)
    v = kc.run_check("cpu_kernels", "float32", isa="generic")
    assert not v.ok and re.match(r"paged_decode_attention \((float32|bfloat16|float16) cache\): max \|kernel - composed\| ",
                                 v.detail), v.detail
    monkeypatch.setattr(cpu_kernels, "paged_decode_attention", real)
    real_rms = cpu_kernels.rms_norm
    monkeypatch.setattr(cpu_kernels, "rms_norm", lambda x, w, eps, isa: real_rms(x, w * 0 + 1, eps, isa))
    v = kc.run_check("cpu_kernels", "float32", isa="generic")
    assert not v.ok and v.detail.startswith("rms_norm: max |kernel - composed| ")


def test_the_fused_rms_norm_check_on_this_host(cache_dir):
    """Paddle's CPU fused_rms_norm in a child: passes on an AVX-512 host, and dies (SIGILL) on an
    AVX2-only one, where the plan never asks (test_platform_plan)."""
    v = kc.run_in_child("fused_rms_norm", "float32")
    if not cpu_features.host_cpu().has("avx512f"):
        # the other kind of host: the child dies (SIGILL) and the parent gets a failed verdict
        assert not v.ok and v.detail == "the check process died with SIGILL", v.detail
        return
    assert v.ok and v.detail.endswith("(in a child process)"), v.detail


def test_plan_for_device_logs_the_checks_and_their_cost(cache_dir, caplog):
    with caplog.at_level(logging.INFO, logger="paddle_llm_engine.platforms.plan"):
        cold = plan_for_device("cpu")
        warm = plan_for_device("cpu")
    assert cold.kernels["cpu_kernels"] is True
    line = next(d for d in cold.decisions if d.startswith("cpu_kernels: on"))
    assert "; verified: " in line and "(cached verdict)" not in line
    assert "; verified (cached verdict): " in next(d for d in warm.decisions if d.startswith("cpu_kernels: on"))
    assert cold.decisions[-1].startswith("kernel checks: cpu_kernels ") and cold.decisions[-1].endswith(" s")
    assert warm.decisions[-1] == "kernel checks: cpu_kernels cached"
    assert "platform cpu: kernel checks: cpu_kernels cached" in caplog.text


def test_engine_with_a_garbage_kernel_runs_the_composed_ops_and_says_why(tiny_model_dir, monkeypatch, cache_dir,
                                                                        caplog):
    """An engine whose C++ kernels (and Paddle's fused RMSNorm) fail their checks starts on the
    composed ops, logs why, and gives the greedy tokens of an engine with the verified kernels."""
    from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams

    kw = dict(model_dir=tiny_model_dir, device="cpu", num_kv_blocks=16, block_size=16, max_model_len=128)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

    def run(engine):
        engine.add_request("r", list(range(30, 47)), params)
        toks = []
        while engine.has_unfinished_requests():
            for o in engine.step():
                toks.extend(o.token_ids)
        return toks

    verified = LLMEngine(EngineConfig(**kw))
    assert dict(verified.executor.worker.ops.names)["rms_norm"].startswith("cpu_")
    fake(monkeypatch, "cpu_kernels", fakes.garbage)
    fake(monkeypatch, "fused_rms_norm", fakes.garbage, isolate=True)
    with caplog.at_level(logging.INFO, logger="paddle_llm_engine.platforms.plan"):
        composed = LLMEngine(EngineConfig(**kw))
    names = dict(composed.executor.worker.ops.names)
    assert names["rms_norm"] == "composed" and names["rotary_kv_write"] == "composed", names
    assert "platform cpu: cpu_kernels: off, verification failed: max |kernel - composed| 3.1e+07" in caplog.text
    if cpu_features.host_cpu().has("avx512f"):  # considered once the C++ kernels are off, and refused too
        assert "platform cpu: fused_rms_norm: off, verification failed: max |kernel - composed| 3.1e+07" in caplog.text
    assert run(composed) == run(verified)


def test_without_a_verifier_every_optional_kernel_stays_off():
    plan = decide(cpu_facts(XEON_AVX512))
    assert not any(plan.kernels.values()) and plan.cpu_isa is None
    assert "cpu_kernels: off, verification failed: no verifier given" in plan.decisions
