"""A paddle / paddle-custom-gcu mismatch (or a missing or unloadable plug-in) is refused at
start-up with one clear PlatformError naming the versions found and supported, never an obscure
error from deep inside the plug-in; `device: auto` picks the CPU on this host (no plug-in)."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from paddle_llm_engine import EngineConfig, LLMEngine
from paddle_llm_engine.platforms import device as platforms
from paddle_llm_engine.platforms import PlatformError, check_gcu_versions, resolve_device


def _plugin_installed() -> bool:
    try:
        md.version("paddle-custom-gcu")
        return True
    except md.PackageNotFoundError:
        return False


pytestmark = pytest.mark.skipif(_plugin_installed(), reason="these tests describe a host without the GCU plug-in")


@pytest.mark.parametrize("paddle_v,plugin_v", [("3.3.1", "3.3.0"), ("3.3.0", "3.3.1"), ("3.1.0", "3.1.0.dev20250601"),
                                               ("3.2.2", "3.2.0")])
def test_matching_versions_pass(paddle_v, plugin_v):
    check_gcu_versions(paddle_v, plugin_v)  # no exception


@pytest.mark.parametrize("paddle_v,plugin_v", [("3.3.1", "3.1.0"), ("3.1.0", "3.3.0"), ("2.6.2", "2.6.0"),
                                               ("3.0.0", "3.0.0"), ("3.3.1", "3.30.0"), ("4.0.0", "3.3.0")])
def test_mismatch_is_one_error_naming_found_and_supported(paddle_v, plugin_v):
    with pytest.raises(PlatformError) as ei:
        check_gcu_versions(paddle_v, plugin_v)
    msg = str(ei.value)
    assert f"paddlepaddle {paddle_v}" in msg and f"paddle-custom-gcu {plugin_v}" in msg  # found
    for paddle_mm, plugin_mms in platforms.SUPPORTED_GCU_MATRIX.items():                  # supported
        assert f"paddlepaddle {paddle_mm}.x" in msg
        assert all(p in msg for p in plugin_mms)
    assert "\n" not in msg


def test_plugin_absent_is_a_clear_error():
    with pytest.raises(PlatformError) as ei:
        check_gcu_versions()  # this host: paddlepaddle installed, no plug-in
    msg = str(ei.value)
    assert "paddle-custom-gcu" in msg and "not installed" in msg
    assert f"paddlepaddle {md.version('paddlepaddle')}" in msg
    assert "supported:" in msg and "device to cpu" in msg


def test_resolve_gcu_on_cpu_host_fails_clearly():
    for device in ("gcu", "gcu:0"):
        with pytest.raises(PlatformError) as ei:
            resolve_device(device, 0)
        assert "paddle-custom-gcu plug-in is not installed" in str(ei.value)


def test_engine_with_device_gcu_refuses_before_loading(tiny_model_dir):
    with pytest.raises(PlatformError) as ei:
        LLMEngine(EngineConfig(model_dir=tiny_model_dir, device="gcu", num_kv_blocks=8, max_model_len=64))
    assert "paddle-custom-gcu" in str(ei.value)


def test_auto_picks_cpu_here():
    assert platforms.gcu_available() is False
    assert resolve_device("auto", 0) == "cpu"
    assert resolve_device("auto", 3) == "cpu"
    assert resolve_device("cpu", 1) == "cpu"


@pytest.mark.parametrize("device", ["cuda", "gpu:0", "gcu:x", "GCU", ""])
def test_unknown_device_names_are_rejected(device, monkeypatch):
    monkeypatch.setattr(platforms, "check_gcu_versions", lambda *a: None)
    monkeypatch.setattr(platforms, "gcu_available", lambda: True)
    with pytest.raises(ValueError) as ei:
        resolve_device(device, 0)
    assert "'auto', 'cpu' or 'gcu[:id]'" in str(ei.value)


def test_simulated_gcu_host(monkeypatch):
    """With the plug-in 'installed' at a supported version and the device type registered, auto and gcu
    resolve to gcu:<id>; with a mismatched plug-in, auto refuses too (no silent CPU fallback)."""
    versions = {"paddlepaddle": "3.3.1", "paddle-custom-gcu": "3.3.0"}
    monkeypatch.setattr(platforms, "_version", lambda dist: versions.get(dist))
    monkeypatch.setattr(platforms, "gcu_available", lambda: True)
    assert resolve_device("auto", 2) == "gcu:2"
    assert resolve_device("gcu", 1) == "gcu:1"
    assert resolve_device("gcu:3", 0) == "gcu:3"
    versions["paddle-custom-gcu"] = "3.1.0"
    with pytest.raises(PlatformError) as ei:
        resolve_device("auto", 0)
    assert "found paddlepaddle 3.3.1 and paddle-custom-gcu 3.1.0" in str(ei.value)


def test_plugin_installed_but_not_loaded(monkeypatch):
    """Matching versions, but the plug-in did not register "gcu" (driver / runtime problem)."""
    versions = {"paddlepaddle": "3.3.1", "paddle-custom-gcu": "3.3.0"}
    monkeypatch.setattr(platforms, "_version", lambda dist: versions.get(dist))
    monkeypatch.setattr(platforms, "gcu_available", lambda: False)
    for device in ("gcu", "auto"):  # auto too: an installed plug-in that did not load is not a CPU host
        with pytest.raises(PlatformError) as ei:
            resolve_device(device, 0)
        msg = str(ei.value)
        assert "paddle-custom-gcu 3.3.0" in msg and "paddlepaddle 3.3.1" in msg and "did not load" in msg
    versions.pop("paddle-custom-gcu")  # no plug-in installed: auto means the CPU
    assert resolve_device("auto", 0) == "cpu"
