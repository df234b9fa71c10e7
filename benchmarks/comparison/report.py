"""The report of benchmarks/compare.py: the progress line of each level (stderr), the plain-text tables
for stdout (decode and output tokens/s, share of the read-bandwidth limit in %, TTFT and ITL in ms,
request counts; ratios of decode tokens/s) and the Markdown for docs/benchmarks/results.md."""

from __future__ import annotations

import math

from comparison.common import LABELS, OURS, SYSTEMS, bench_engine_report, log


def fmt(v, digits=1) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def ms(p: dict, key: str) -> str:
    v = (p or {}).get(key)
    return "-" if v is None else f"{v * 1000:.0f}"


def ratio(a, b) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def print_level_progress(system: str, c: int, s: dict) -> None:
    log(f"{LABELS[system]} @ {c}: decode {fmt(s.get('decode_tokens_per_s'))} tok/s, "
        f"{s['requests_done']}/{s['requests_sent']} done, {s['requests_failed']} failed, "
        f"{s['requests_cut_at_time_cap']} cut, tokens/request p50 {fmt(s['output_tokens_per_request']['p50'], 0)}")


def decode(results: dict, system: str, c: int):
    return ((results.get(system) or {}).get("levels") or {}).get(c, {}).get("decode_tokens_per_s")


def build_report(summary: dict) -> tuple[str, str]:
    """(plain-text tables for stdout, Markdown for docs/benchmarks/results.md)."""
    res = summary["results"]
    systems = [s for s in SYSTEMS if s in res and res[s].get("levels")]
    label = {s: LABELS[s] + (summary["ours_suffix"] if s in OURS else "") for s in SYSTEMS}
    lines = (_text_header(summary, systems, label) + _text_levels(summary, systems, label)
             + _text_ratios(summary, systems, label))
    return "\n".join(lines), "\n".join(_markdown(summary, systems, label)) + "\n"


def _text_header(summary: dict, systems: list[str], label: dict) -> list[str]:
    """Host, model and its limit, workload; what each system is, or why it did not run."""
    h, bw, res = summary["host"], summary["bandwidth"], summary["results"]
    lim = summary["limit_per_seq"]
    lines = [
        f"host: {h['cpu']} ({', '.join(h['isa']) or 'no avx2'}), {h['cores']} cores, {h['threads']} threads "
        f"per system; read bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s ({bw['method']})"
        + (f"; competitor: {h['competitor']}" if h.get("competitor") else ""),
        f"model: {summary['model']}, {summary['weight_bytes']['fp32'] / 1e6:.0f} MB fp32 read per decode step -> "
        f"limit {lim['fp32']:.1f} tok/s per sequence"
        + "".join(f" ({name} {summary['weight_bytes'][k] / 1e6:.0f} MB -> {lim[k]:.1f})"
                  for k, name in (("q8_0", "Q8_0"), ("q4_1", "Q4_1"), ("wint8", "wint8 estimate"),
                                  ("wint4", "wint4 estimate")) if k in lim),
        f"workload: greedy, {summary['max_tokens']} tokens per request (EOS ignored), {summary['requests_per_stream']} "
        f"request(s) per stream, prompts {summary['prompt_tokens_min']}-{summary['prompt_tokens_max']} tokens",
        "",
    ]
    for s in systems:
        lines.append(f"{label[s]:<24} {res[s]['info']}")
    for s, note in summary["notes"].items():
        lines.append(f"{label.get(s, s):<24} NOT RUN: {note}")
    lines.append("")
    return lines


def _text_levels(summary: dict, systems: list[str], label: dict) -> list[str]:
    """One row per system and stream count."""
    res, conc = summary["results"], summary["concurrency"]
    lines = []
    hdr = (f"{'system':<24} {'streams':>7} {'decode tok/s':>12} {'out tok/s':>9} {'of limit':>8} | "
           f"{'TTFT ms p50':>11} {'p90':>6} {'p99':>6} | {'ITL ms p50':>10} {'p90':>6} {'p99':>6} | {'done':>4} {'cut':>3} {'fail':>4}")
    lines += [hdr, "-" * len(hdr)]
    for s in systems:
        for c in conc:
            lv = res[s]["levels"].get(c)
            if not lv:
                continue
            lines.append(
                f"{label[s]:<24} {c:>7} {fmt(lv.get('decode_tokens_per_s')):>12} {fmt(lv['output_tokens_per_s']):>9} "
                f"{fmt(100 * lv['of_limit'], 0) + '%' if lv.get('of_limit') else '-':>8} | "
                f"{ms(lv['ttft_s'], 'p50'):>11} {ms(lv['ttft_s'], 'p90'):>6} {ms(lv['ttft_s'], 'p99'):>6} | "
                f"{ms(lv['itl_s'], 'p50'):>10} {ms(lv['itl_s'], 'p90'):>6} {ms(lv['itl_s'], 'p99'):>6} | "
                f"{lv['requests_done']:>4} {lv['requests_cut_at_time_cap']:>3} {lv['requests_failed']:>4}")
    return lines


def _text_ratios(summary: dict, systems: list[str], label: dict) -> list[str]:
    """Ours / the others, the OpenAI frontend's overhead, token agreement, what the columns mean."""
    res, conc = summary["results"], summary["concurrency"]
    lines = []
    peers = [s for s in systems if s not in OURS]
    ours = [s for s in systems if s in OURS]
    others = peers + (["offline"] if "offline" in ours and len(ours) > 1 else [])
    if ours and others:
        lines += ["", "ratios of decode tok/s, ours / other (> 1: ours faster)"]
        hdr = f"{'ours':<24} {'streams':>7} " + " ".join(f"{'/ ' + LABELS[p]:>16}" for p in others)
        lines += [hdr, "-" * len(hdr)]
        for o in ours:
            for c in conc:
                cells = [ratio(decode(res, o, c), decode(res, p, c)) if p != o else "-" for p in others]
                lines.append(f"{label[o]:<24} {c:>7} " + " ".join(f"{x:>16}" for x in cells))
    overhead = "openai" in systems and "llm" in systems
    if overhead:
        lines += ["", "OpenAI frontend overhead: decode tok/s of ours OpenAI / ours Triton llm (same text, same server; "
                  "issue 18 asks >= 0.95x)"]
        for c in conc:
            lines.append(f"  {c:>3} stream(s): {fmt(decode(res, 'openai', c))} / {fmt(decode(res, 'llm', c))} = "
                         f"{ratio(decode(res, 'openai', c), decode(res, 'llm', c))}")
    for line in summary.get("agreement", []):
        lines.append(line)
    lines.append("")
    lines.append("decode tok/s: tokens after each request's first / time in which some request was decoding; out tok/s: "
                 "all tokens / wall time; of limit: decode tok/s / (streams x limit per sequence); TTFT / ITL: per "
                 "request and token, client side (offline: engine step ends; HF: its step clock)")
    return lines


def _markdown(summary: dict, systems: list[str], label: dict) -> list[str]:
    """Decode tok/s and ratios by stream count, then TTFT / ITL by system and stream count."""
    h, bw, res = summary["host"], summary["bandwidth"], summary["results"]
    conc, lim = summary["concurrency"], summary["limit_per_seq"]
    peers = [s for s in systems if s not in OURS]
    ours = [s for s in systems if s in OURS]
    overhead = "openai" in systems and "llm" in systems
    md = [f"Host: {h['cpu']} ({', '.join(h['isa']) or 'no AVX2'}), {h['threads']} threads per system "
          f"({h['cores']} cores); read bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s measured in the same run "
          f"-> {lim['fp32']:.1f} tok/s per sequence for {summary['weight_bytes']['fp32'] / 1e6:.0f} MB of fp32 "
          f"weights. {summary['model']}, greedy, {summary['max_tokens']} tokens per request with EOS ignored, "
          f"aggregate decode tokens/s (`benchmarks/compare.py`, {summary['date']}).", ""]
    cols = systems
    md.append("| streams | " + " | ".join(label[s] for s in cols) + " | "
              + " | ".join(f"{label[o]} / {LABELS[p]}" for o in ours[:1] for p in peers)
              + (" | " if ours[:1] and peers else "")
              + " | ".join(f"{label[o]} / {label['offline']}" for o in ours if o != "offline" and "offline" in ours)
              + (" | " if len(ours) > 1 and "offline" in ours else "")
              + (f"{label['openai']} / {label['llm']} | " if overhead else "")
              + (f"{label[ours[0]]} of the limit |" if ours else ""))
    ncols = md[-1].count("|") - 1
    md.append("|" + "---|" * ncols)
    for c in conc:
        row = [str(c)] + [fmt(decode(res, s, c)) for s in cols]
        row += [ratio(decode(res, ours[0], c), decode(res, p, c)) for o in ours[:1] for p in peers]
        row += [ratio(decode(res, o, c), decode(res, "offline", c)) for o in ours if o != "offline" and "offline" in ours]
        if overhead:
            row.append(ratio(decode(res, "openai", c), decode(res, "llm", c)))
        if ours:
            ol = res[ours[0]]["levels"].get(c, {}).get("of_limit")
            row.append(f"{100 * ol:.0f}%" if ol else "-")
        md.append("| " + " | ".join(row) + " |")
    md += ["", "| system | streams | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms |", "|---|---|---|---|"]
    for s in systems:
        for c in conc:
            lv = res[s]["levels"].get(c)
            if lv:
                md.append(f"| {label[s]} | {c} | {ms(lv['ttft_s'], 'p50')} / {ms(lv['ttft_s'], 'p90')} / "
                          f"{ms(lv['ttft_s'], 'p99')} | {ms(lv['itl_s'], 'p50')} / {ms(lv['itl_s'], 'p90')} / "
                          f"{ms(lv['itl_s'], 'p99')} |")
    return md


def agreement_lines(res: dict, conc: list[int], eos: list[int]) -> list[str]:
    be = bench_engine_report()
    out = []
    base = (res.get("offline") or {}).get("levels") or {}
    for peer in ("hf", "llamacpp-f32", "llamacpp-q8_0", "llamacpp-q4_1"):
        lv = (res.get(peer) or {}).get("levels") or {}
        for c in conc[:1]:
            if c in base and c in lv and base[c].get("token_ids") and lv[c].get("token_ids"):
                n = min(len(base[c]["token_ids"]), len(lv[c]["token_ids"]))
                note = (" (llama.cpp's ignore_eos masks EOS: its tokens part from ours at our first EOS)"
                        if peer.startswith("llamacpp") else "")
                out.append(f"greedy tokens, ours offline vs {LABELS[peer]} at {c} stream(s): "
                           f"{be.agreement(base[c]['token_ids'][:n], lv[c]['token_ids'][:n], eos)}{note}")
    return out
