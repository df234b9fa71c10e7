"""The numbers and the table of benchmarks/bench_engine.py: per-batch rates derived from the timed runs
(prefill / decode / end-to-end tokens/s, step ms, the share of the bandwidth limit), the greedy
agreement of ours and the peer, and the printed report."""

from __future__ import annotations

import math


def derive(r: dict, bytes_per_step: float, bandwidth: float) -> dict:
    b = r["batch"]
    decode_tps = r["decode_tokens"] / r["decode_s"] if r["decode_s"] > 0 else math.nan
    limit = b * bandwidth / bytes_per_step
    return {
        "batch": b,
        "prompt_tokens": r["prompt_tokens"],
        "prefill_s": r["prefill_s"],
        "prefill_tokens_per_s": r["prompt_tokens"] / r["prefill_s"],
        "decode_tokens_per_s": decode_tps,
        "step_ms": 1000.0 * r["decode_s"] / r["decode_steps"] if r["decode_steps"] else math.nan,
        "total_tokens_per_s": r["output_tokens"] / r["total_s"],
        "bandwidth_limit_tokens_per_s": limit,
        "of_bandwidth_limit": decode_tps / limit,
    }


def agreement(ours: list[list[int]], peer: list[list[int]], eos_ids: list[int]) -> str:
    """Greedy agreement per sequence. Tokens after an (ignored) EOS continue an out-of-distribution
    context where near-ties are common, so agreement is also given up to each sequence's first EOS."""
    def upto_eos(seq):
        for i, t in enumerate(seq):
            if t in eos_ids:
                return seq[:i + 1]
        return seq
    same = sum(a == b for a, b in zip(ours, peer))
    same_eos = sum(upto_eos(a) == b[:len(upto_eos(a))] for a, b in zip(ours, peer))
    prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
              for a, b in zip(ours, peer)]
    return (f"{same}/{len(ours)} identical, {same_eos}/{len(ours)} identical up to the first EOS, "
            f"shortest common prefix {min(prefix)} tokens")


def peer_rows(peer: dict, ours_raw: list[dict], eos_ids: list[int], bytes_per_step: float,
              bandwidth: float) -> list[dict]:
    """The peer's runs derived like ours, each with its greedy agreement with ours at the same batch."""
    ours_ids = {r["batch"]: r["token_ids"] for r in ours_raw}
    rows = []
    for r in peer["results"]:
        r["decode_tokens"] = r["batch"] * r["decode_steps"]
        d = derive(r, bytes_per_step, bandwidth)
        d["padded_len"] = r["padded_len"]
        if r["batch"] in ours_ids:
            d["agreement"] = agreement(ours_ids[r["batch"]], r["token_ids"], eos_ids)
        rows.append(d)
    return rows


def fmt(v, digits=1):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}f}"


def ratio(a, b):
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return "-"
    return f"{a / b:.2f}x"


def print_report(summary: dict) -> None:
    s = summary
    print(f"model {s['model_dir']}: {s['parameters'] / 1e6:.1f} M parameters, {s['bytes_per_step'] / 1e6:.0f} MB "
          f"fp32 read per decode step; bandwidth {s['bandwidth_gbs']:g} GB/s -> "
          f"{s['bandwidth_gbs'] * 1e9 / s['bytes_per_step']:.1f} tokens/s per sequence at the limit")
    print(f"workload: greedy, {s['max_tokens']} tokens per request (EOS ignored), chat-formatted prompts, "
          f"{s['threads']} threads")
    o = s["ours"]
    print(f"ours: device {o['device']}, quantization {o.get('quantization', 'none')}, engine load {o['load_s']:.1f} s")
    peer = s.get("peer")
    if peer:
        print(f"peer: HF transformers {peer['transformers']} / torch {peer['torch']} ({peer['python']}), "
              f"{peer['threads']} threads")
    elif s.get("peer_note"):
        print(f"peer: {s['peer_note']}")
    print()
    hdr = (f"{'B':>3} {'':5} {'prefill tok/s':>13} {'decode tok/s':>12} {'step ms':>8} {'e2e tok/s':>9} "
           f"{'BW limit':>8} {'of limit':>8}")
    print(hdr)
    print("-" * len(hdr))
    peer_by_b = {r["batch"]: r for r in (s.get("peer_results") or [])}
    for r in s["ours_results"]:
        rows = [("ours", r)]
        p = peer_by_b.get(r["batch"])
        if p:
            rows.append(("peer", p))
        for who, x in rows:
            print(f"{x['batch']:>3} {who:5} {fmt(x['prefill_tokens_per_s']):>13} {fmt(x['decode_tokens_per_s']):>12} "
                  f"{fmt(x['step_ms']):>8} {fmt(x['total_tokens_per_s']):>9} "
                  f"{fmt(x['bandwidth_limit_tokens_per_s']):>8} {100 * x['of_bandwidth_limit']:>7.0f}%")
        if p:
            print(f"{'':>3} {'o/p':5} {ratio(r['prefill_tokens_per_s'], p['prefill_tokens_per_s']):>13} "
                  f"{ratio(r['decode_tokens_per_s'], p['decode_tokens_per_s']):>12} "
                  f"{ratio(r['step_ms'], p['step_ms']):>8} "
                  f"{ratio(r['total_tokens_per_s'], p['total_tokens_per_s']):>9}")
            if "agreement" in p:
                print(f"{'':>3} {'':5} greedy tokens vs peer: {p['agreement']}")
    for b in sorted(set(peer_by_b) - {r["batch"] for r in s["ours_results"]}):
        x = peer_by_b[b]
        print(f"{b:>3} {'peer':5} {fmt(x['prefill_tokens_per_s']):>13} {fmt(x['decode_tokens_per_s']):>12} "
              f"{fmt(x['step_ms']):>8} {fmt(x['total_tokens_per_s']):>9}")
    print("\nprefill tok/s: prompt tokens / prefill time (peer: real tokens, its padding included in the time); "
          "decode: tokens after each request's first / decode time; e2e: all output tokens / whole run; "
          "o/p: ours / peer (step ms: < 1x is faster)")
