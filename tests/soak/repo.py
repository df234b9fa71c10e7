"""The soak's copy of model_repository/ (the shipped configs are never touched).

- `llm`: a low waiting-queue limit, so that a flood can pass it, and a bounded max_num_seqs. The
  limit's parameter is whichever name the shipped llm config declares (`max_num_waiting`, else the
  older `max_waiting_requests`): the engine refuses parameter names it does not know.
- `llm_tp2`: a copy of `llm` with tensor_parallel_size 2 on a tiny random Llama (SmolLM2's 9 heads
  admit no TP=2), a small KV pool and one thread per rank, for the TP-worker fault.
- LoRA: `llm` serves two random adapters of the default model (LORA_NAMES, made once in out_dir by
  tests/support/lora_adapters.py) with max_loras 1, so that requests of the two adapters and the
  base share steps and wait for the slot; the TP copy serves none.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

from repo_edit import set_config_parameter  # tests/support

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]

MODEL_REPO = REPO_ROOT / "model_repository"
WAITING_KEYS = ("max_num_waiting", "max_waiting_requests")  # new name first
LORA_NAMES = ("soak_a", "soak_b")


@dataclasses.dataclass
class SoakRepo:
    """Where the copy is and the limits it sets (the traffic and the flood size depend on them)."""

    path: Path
    waiting_key: str
    max_waiting: int
    max_num_seqs: int
    tp_model: str | None
    loras: tuple[str, ...] = ()


def config_value(config: Path, key: str) -> str | None:
    """The string_value of parameter `key` in a config.pbtxt, None when it is not declared."""
    m = re.search(r'^[ \t]*parameters\s*\{\s*key:\s*"' + re.escape(key)
                  + r'"\s*value:\s*\{\s*string_value:\s*"([^"]*)"', config.read_text(), re.M)
    return m.group(1) if m else None


def waiting_key(config: Path) -> str:
    """The waiting-queue limit parameter this code base's llm config declares."""
    for k in WAITING_KEYS:
        if config_value(config, k) is not None:
            return k
    raise RuntimeError(f"{config} declares none of {WAITING_KEYS}: cannot set the flood limit")


def make_adapters(out_dir: Path, model_dir: Path) -> dict[str, Path]:
    """{name: folder} of the soak's LoRA adapters for model_dir (made once in out_dir)."""
    from lora_adapters import make_adapter  # tests/support

    out = {}
    for i, name in enumerate(LORA_NAMES):
        target = Path(out_dir) / "lora" / name
        if not (target / "adapter_model.safetensors").is_file():
            make_adapter(model_dir, target, seed=100 + i, r=8, magnitude=3.0)
        out[name] = target.resolve()
    return out


def prepare(out_dir: Path, tiny_model_dir: Path | None, max_waiting: int = 8, max_num_seqs: int = 16,
            tp: bool = True, loras: dict[str, Path] | None = None) -> SoakRepo:
    """Copy model_repository into out_dir/model_repository (replacing an old copy) and edit it.
    loras: {name: folder} of adapters `llm` serves (enable_lora 1, max_loras 1)."""
    dst = Path(out_dir) / "model_repository"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(MODEL_REPO, dst, ignore=shutil.ignore_patterns("__pycache__"))
    llm_cfg = dst / "llm" / "config.pbtxt"
    key = waiting_key(llm_cfg)
    set_config_parameter(llm_cfg, key, str(max_waiting))
    set_config_parameter(llm_cfg, "max_num_seqs", str(max_num_seqs))
    if loras:
        set_config_parameter(llm_cfg, "enable_lora", "1")
        set_config_parameter(llm_cfg, "max_loras", "1")
        set_config_parameter(llm_cfg, "lora_modules", ",".join(f"{n}={p}" for n, p in loras.items()))
    tp_model = None
    if tp:
        if tiny_model_dir is None:
            raise ValueError("the TP model needs a tiny checkpoint folder")
        tp_model = "llm_tp2"
        tp_dir = dst / tp_model
        shutil.copytree(dst / "llm", tp_dir)
        cfg = tp_dir / "config.pbtxt"
        text = cfg.read_text()
        text, n = re.subn(r'^name:\s*"llm"', f'name: "{tp_model}"', text, count=1, flags=re.M)
        if n != 1:
            raise RuntimeError(f"no name line in {cfg}")
        cfg.write_text(text)
        for k, v in (("model_dir", str(Path(tiny_model_dir).resolve())), ("tensor_parallel_size", "2"),
                     ("num_kv_blocks", "64"), ("block_size", "16"), ("max_model_len", "1024"),
                     ("max_num_seqs", "4"), ("num_threads", "1"), (key, "16"), ("enable_lora", "0"),
                     ("lora_modules", "")):
            set_config_parameter(cfg, k, v)
    return SoakRepo(dst, key, max_waiting, max_num_seqs, tp_model, tuple(loras or ()))


def make_tiny_model(out_dir: Path, tokenizer_dir: Path) -> Path:
    """The tiny random Llama of the unit tests (4 heads, 2 KV heads), made once in out_dir."""
    from tiny_model import make_tiny_llama  # tests/support

    target = Path(out_dir) / "tiny_llama"
    if not (target / "model.safetensors").is_file():
        make_tiny_llama(target, tokenizer_dir)
    return target
