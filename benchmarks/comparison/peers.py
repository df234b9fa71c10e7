"""The peers of benchmarks/compare.py: HF transformers (benchmarks/hf_transformers_peer.py in
build/ref-venv, static batches; its step clock gives per-token times) and llama.cpp's server
(benchmarks/llamacpp_peer.py in build/peer-venv, which is made here on first use) on F32 and Q8_0
GGUFs of the same weights and on the default model's shipped Q4_1 GGUF. Each returns its levels' statistics (measure.summarize) and token ids."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from comparison.common import (BENCH_DIR, LABELS, PEER_PINS, PEER_VENV, WARMUP_TOKENS, bench_engine, child_env,
                               gguf_export, log, log_tail)
from comparison.measure import make_record, summarize
from comparison.report import print_level_progress
from comparison.traffic import llamacpp_load


def _base_python() -> str:
    return getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable


def ensure_peer_venv(pins: list[str]) -> Path:
    """build/peer-venv with `pins` installed (idempotent: a stamp lists what was installed).
    Raises RuntimeError with pip's last lines when an install fails."""
    py = PEER_VENV / "bin" / "python"
    stamp = PEER_VENV / ".installed.json"
    have = json.loads(stamp.read_text()) if stamp.is_file() and py.is_file() else []
    missing = [p for p in pins if p not in have]
    if not missing:
        return py
    if not py.is_file():
        base = _base_python()
        log(f"creating {PEER_VENV} with {base}")
        subprocess.run([base, "-m", "venv", str(PEER_VENV)], check=True, timeout=300)
    log(f"installing {' '.join(missing)} into {PEER_VENV}")
    proc = subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q", *missing],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-8:])
        raise RuntimeError(f"pip install {' '.join(missing)} into {PEER_VENV} failed:\n{tail}")
    stamp.write_text(json.dumps(sorted(set(have) | set(missing))) + "\n")
    return py


def run_hf(ctx) -> dict:
    a = ctx.args
    be = bench_engine()
    ref = be.find_ref_python(a.ref_python)
    if ref is None:
        raise RuntimeError("no build/ref-venv/bin/python (make it with: bash scripts/setup.sh --reference)")
    batches = [c for c in a.concurrency for _ in range(a.requests_per_stream)]
    spec = {"model_dir": str(Path(a.model_dir).resolve()), "threads": a.threads, "max_new_tokens": a.max_tokens,
            "batches": batches, "prompts": ctx.prompt_ids[:max(a.concurrency)], "pad_token_id": ctx.pad_token_id,
            "warmup_tokens": WARMUP_TOKENS}
    log_path = ctx.out_dir / "hf_transformers_peer.log"
    with open(log_path, "wb") as err:
        proc = subprocess.run([str(ref), str(BENCH_DIR / "hf_transformers_peer.py")], input=json.dumps(spec), text=True,
                              stdout=subprocess.PIPE, stderr=err, env=child_env(a.threads), timeout=ctx.child_timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"hf_transformers_peer.py exited with code {proc.returncode}; tail of {log_path}:\n"
                           f"{log_tail(log_path)}")
    out = json.loads(proc.stdout)
    if "step_s" not in out["results"][0]:
        raise RuntimeError("hf_transformers_peer.py did not report step_s (an older copy?)")
    levels = {}
    by_c: dict[int, list] = {}
    for r in out["results"]:
        by_c.setdefault(r["batch"], []).append(r)
    for c, waves in by_c.items():
        recs, offset, ids = [], 0.0, []
        for w, r in enumerate(waves):  # static batches back to back: wave w starts when w-1 ended
            for j in range(c):
                times = [offset + s for s in r["step_s"]]
                recs.append(make_record(w * c + j, offset, times, [1] * len(times), times[-1]))
            ids.extend(r["token_ids"])
            offset += r["step_s"][-1]
        levels[c] = {**summarize(recs, 0.0, offset), "token_ids": ids}
    return {"levels": levels, "info": f"transformers {out['transformers']}, torch {out['torch']}, "
                                      f"{out['threads']} threads, static batch ({ref})"}


class LlamaCppServer:
    """benchmarks/llamacpp_peer.py in the peer venv; stopped by closing its stdin (then killed)."""

    def __init__(self, python: Path, gguf: str, threads: int, parallel: int, ctx_per_slot: int, max_seconds: float,
                 log_path: Path):
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [str(python), str(BENCH_DIR / "llamacpp_peer.py"), "--model", gguf, "--threads", str(threads),
             "--parallel", str(parallel), "--ctx-per-slot", str(ctx_per_slot), "--max-seconds", str(max_seconds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=child_env(threads),
            start_new_session=True)
        self.info = None

    def wait_ready(self, timeout: float) -> dict:
        box: list = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not box or not box[0]:
            raise RuntimeError(f"llama.cpp server not ready after {timeout:.0f} s (exit code {self.proc.poll()}; "
                               f"log {self.log.name})")
        self.info = json.loads(box[0])
        return self.info

    def stop(self) -> int:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            code = self.proc.wait()
        self.log.close()
        return code


def run_llamacpp(ctx, qtype: str) -> dict:
    a = ctx.args
    py = ensure_peer_venv(PEER_PINS)
    info = gguf_export().ensure_gguf(a.model_dir, ctx.out_dir / "gguf", qtype)
    longest = max(len(p) for p in ctx.prompt_ids)
    per_slot = 256 * math.ceil((longest + a.max_tokens + 16) / 256)
    server = LlamaCppServer(py, info["path"], a.threads, max(a.concurrency), per_slot, ctx.child_timeout,
                            ctx.out_dir / f"llamacpp-{qtype}.log")
    levels = {}
    try:
        sinfo = server.wait_ready(300)
        log(f"llama.cpp {qtype} ready after {sinfo['load_s']:.1f} s at {sinfo['address']}")
        for c in a.concurrency:
            llamacpp_load(sinfo["address"], [ctx.warmup_ids], c, c, WARMUP_TOKENS, a.duration)
            log(f"{LABELS['llamacpp-' + qtype.lower()]}: {c} stream(s)")
            raw, t0, t_end = llamacpp_load(sinfo["address"], ctx.prompt_ids, c, c * a.requests_per_stream,
                                           a.max_tokens, a.duration)
            raw.sort(key=lambda x: x[0])
            recs = [make_record(i, r["sent"], r["times"], r["tokens"], r["final"], r["error"], r["cut"]) for i, r in raw]
            levels[c] = {**summarize(recs, t0, t_end), "token_ids": [r["ids"] for _, r in raw]}
            print_level_progress("llamacpp-" + qtype.lower(), c, levels[c])
    finally:
        server.stop()
    return {"levels": levels, "tensor_bytes": info["tensor_bytes"],
            "info": f"xllamacpp {sinfo['xllamacpp']} server, {max(a.concurrency)} slots x {per_slot} ctx, "
                    f"continuous batching, {Path(info['path']).name}"}
