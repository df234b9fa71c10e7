"""`llm`'s logprob entries -> OpenAI's logprobs objects.

llm sends, per generated token, {token_id: {"logprob", "rank", "decoded_token"}}: the sampled token
first (rank = its rank in the vocabulary), then the `logprobs` most likely tokens (ranks 1..k; the
sampled one appears once, first). decoded_token follows skip_special_tokens (EOS is "" by default)
and one token can be half a UTF-8 character (then it holds U+FFFD), as in vLLM.
"""

from __future__ import annotations


def _split(entry: dict, k: int) -> tuple[dict, list[dict]]:
    """(sampled, the k most likely by logprob, the sampled one included when it is among them)."""
    items = list(entry.values())
    sampled = items[0]
    top = sorted(items, key=lambda e: -e["logprob"])[:k] if k else []
    return sampled, top


def _bytes(s: str) -> list[int]:
    return list(s.encode("utf-8"))


def chat_content(entries: list[dict], k: int) -> list[dict]:
    """Chat: logprobs.content items {"token", "logprob", "bytes", "top_logprobs": [...k]}."""
    out = []
    for entry in entries:
        sampled, top = _split(entry, k)
        out.append({"token": sampled["decoded_token"], "logprob": sampled["logprob"],
                    "bytes": _bytes(sampled["decoded_token"]),
                    "top_logprobs": [{"token": t["decoded_token"], "logprob": t["logprob"],
                                      "bytes": _bytes(t["decoded_token"])} for t in top]})
    return out


def completion(entries: list[dict], k: int, offset: int = 0) -> dict:
    """Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"};
    offset: text offset of the first token (characters of text before it in the choice)."""
    tokens, lps, tops, offsets = [], [], [], []
    for entry in entries:
        sampled, top = _split(entry, k)
        tokens.append(sampled["decoded_token"])
        lps.append(sampled["logprob"])
        tops.append({t["decoded_token"]: t["logprob"] for t in top})
        offsets.append(offset)
        offset += len(sampled["decoded_token"])
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
