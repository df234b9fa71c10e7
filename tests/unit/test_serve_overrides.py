"""`make serve` settings without editing tracked files (paddle_llm_launcher/overrides.py, scripts/launch_triton.py's
LLM_PARAMS / --set): parsing, the key check against what `llm` accepts, and the repository copy (the
shipped config.pbtxt byte for byte unchanged, the copy's llm config carrying the overrides as Triton's
text format, instances as the instance_group count). The real server run with an override is
tests/e2e/test_e2e_serve_overrides.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from paddle_llm_launcher import overrides as ov

REPO = Path(__file__).resolve().parents[2] / "model_repository"


def test_parse_takes_space_separated_items_and_later_ones_win():
    got = ov.parse_overrides(["quantization=wint8 max_model_len=4096", "", "max_model_len=2048"])
    assert got == {"quantization": "wint8", "max_model_len": "2048"}


@pytest.mark.parametrize("item", ["quantization", "=wint8", "a=b c"])
def test_parse_names_a_bad_item(item):
    with pytest.raises(ValueError, match="expected key=value, got"):
        ov.parse_overrides([item])


def test_unknown_keys_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"unknown llm parameter\(s\) quantisation, tp"):
        ov.check_keys({"quantisation": "wint8", "tp": "2", "max_model_len": "1"})
    ov.check_keys({"quantization": "wint8", "speculative_method": "ngram", "default_max_tokens": "16",
                   "instances": "2", "max_waiting_requests": "3"})  # engine, serving, alias, instances
    with pytest.raises(ValueError, match="instances must be an integer >= 1"):
        ov.check_keys({"instances": "0"})


def _params(cfg: Path) -> dict[str, str]:
    return dict(re.findall(r'^[ \t]*parameters\s*\{\s*key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"',
                           cfg.read_text(), re.M))


def test_the_copy_carries_the_overrides_and_the_shipped_files_stay_as_they_are(tmp_path):
    shipped = (REPO / "llm" / "config.pbtxt").read_bytes()
    dest = ov.overlay_repository(REPO, tmp_path / "repo", {"quantization": "wint8", "max_model_len": "4096",
                                                            "speculative_method": "ngram", "instances": "2"})
    assert (REPO / "llm" / "config.pbtxt").read_bytes() == shipped
    got = _params(dest / "llm" / "config.pbtxt")
    before = _params(REPO / "llm" / "config.pbtxt")
    assert got["quantization"] == "wint8" and got["max_model_len"] == "4096" and got["speculative_method"] == "ngram"
    assert {k: v for k, v in got.items() if k not in ("quantization", "max_model_len", "speculative_method")} == \
        {k: v for k, v in before.items() if k not in ("quantization", "max_model_len", "speculative_method")}
    assert re.search(r"instance_group \[ \{ count: 2 kind: KIND_CPU \} \]", (dest / "llm" / "config.pbtxt").read_text())
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in REPO.iterdir() if p.name != "__pycache__")
    # a second start replaces the copy (no leftovers of the previous overrides)
    dest = ov.overlay_repository(REPO, tmp_path / "repo", {"max_model_len": "1024"})
    assert _params(dest / "llm" / "config.pbtxt").get("quantization") == before.get("quantization")


def test_a_value_that_would_break_the_config_text_is_refused(tmp_path):
    with pytest.raises(ValueError, match="may not contain quotes"):
        ov.overlay_repository(REPO, tmp_path / "repo", {"model_dir": 'x" } } parameters { key: "y'})


def test_an_override_of_a_commented_out_parameter_is_set_not_written_into_the_comment(tmp_path):
    """The shipped config lists most settings on commented-out lines; the override must add a real
    parameter line (Triton ignores comments) and leave the listing as it was."""
    shipped_text = (REPO / "llm" / "config.pbtxt").read_text()
    assert re.search(r'^# parameters \{ key: "quantization"', shipped_text, re.M), "the premise: listed, not set"
    dest = ov.overlay_repository(REPO, tmp_path / "repo", {"quantization": "wint8"})
    text = (dest / "llm" / "config.pbtxt").read_text()
    assert _params(dest / "llm" / "config.pbtxt")["quantization"] == "wint8"
    assert re.search(r'^# parameters \{ key: "quantization" value: \{ string_value: "" \} \}', text, re.M)


def test_the_launcher_relays_tritons_cuda_driver_line_as_info_and_every_other_line_unchanged():
    from paddle_llm_launcher.handle import relay_line

    benign = b'E1205 12:42:27.562055 9061 server.cc:241] "CudaDriverHelper has not been initialized."\n'
    got = relay_line(benign)
    assert got.startswith(b'I1205 12:42:27.562055 9061 server.cc:241] "CudaDriverHelper has not been initialized."')
    assert got.endswith(b"\n") and b"without a CUDA driver" in got
    for line in (b"E1205 12:00:00.0 1 model_lifecycle.cc:1] \"failed to load 'llm'\"\n",
                 b"I1205 12:00:00.0 1 server.cc:1] \"CudaDriverHelper has not been initialized.\"\n", b"plain\n"):
        assert relay_line(line) == line
