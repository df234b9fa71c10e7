"""IncrementalDetokenizer with the SmolLM2 tokenizer (byte-level BPE: CJK characters and emoji are
split across several tokens) and StopStringMatcher."""

from __future__ import annotations

import pytest

from paddle_llm_engine.detokenizer import REPLACEMENT, IncrementalDetokenizer, StopStringMatcher

TEXTS = [
    "Hello  world,\n  the quick brown fox jumps over the lazy dog.   Trailing spaces  ",
    "北京是中国的首都，也是一座历史悠久的城市。上海是最大的城市。",
    "Emoji: 😀👍🏽 family 👨‍👩‍👧 waves 🌊🐚 sun ☀️ end",
    " Mixed: café naïve 東京 🍣 and code `x = 1`\n\tdone",
]


def decode(tok, ids, skip=True):
    return tok.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)


def stream(tok, prompt_ids, out_ids, skip=True):
    detok = IncrementalDetokenizer(tok, prompt_ids, skip)
    deltas = [detok.add([t]) for t in out_ids]
    deltas.append(detok.flush())
    return deltas


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time_matches_full_decode(smollm2_tokenizer, text):
    tok = smollm2_tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    deltas = stream(tok, [], ids)
    assert all(REPLACEMENT not in d for d in deltas), deltas
    assert "".join(deltas) == decode(tok, ids) == text


def test_split_characters_are_held_back(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode("a🌊b", add_special_tokens=False)
    # The emoji's 4 UTF-8 bytes span several tokens: some single tokens decode to U+FFFD alone.
    assert any(REPLACEMENT in decode(tok, [t]) for t in ids)
    deltas = stream(tok, [], ids)
    assert "" in deltas[:-1]  # held while incomplete
    assert "".join(deltas) == "a🌊b"


@pytest.mark.parametrize("text", TEXTS)
def test_with_prompt_context(smollm2_tokenizer, text):
    """Deltas after a prompt equal the decoded continuation, leading spaces included."""
    tok = smollm2_tokenizer
    prompt = tok.encode("Some prompt text that ends here:", add_special_tokens=False)
    out = tok.encode(" " + text, add_special_tokens=False)
    deltas = stream(tok, prompt, out)
    assert all(REPLACEMENT not in d for d in deltas)
    full = decode(tok, prompt + out)
    assert "".join(deltas) == full[len(decode(tok, prompt)):] == " " + text


def test_special_tokens_skipped_or_kept(smollm2_tokenizer):
    tok = smollm2_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode("Hi there", add_special_tokens=False) + [im_end]
    assert "".join(stream(tok, [], ids, skip=True)) == "Hi there"
    assert "".join(stream(tok, [], ids, skip=False)) == "Hi there<|im_end|>"


def test_invalid_utf8_from_the_model_never_reaches_the_client(smollm2_tokenizer):
    """Seen with SmolLM2 on "Translate to Chinese": a truncated 3-byte character (EF BC) followed by a
    whole one. The decoder renders the dead bytes as U+FFFD; we drop them (a client never sees U+FFFD)."""
    tok = smollm2_tokenizer
    bang = list(tok.encode("！"))
    assert tok.decode([bang[0]]) == REPLACEMENT  # the first byte token alone is incomplete
    ids = [bang[0]] + bang + [bang[0]]  # dead prefix, the real character, a dead tail
    d = IncrementalDetokenizer(tok, [1, 9690, 198])
    deltas = [d.add([i]) for i in ids] + [d.flush()]
    assert all(REPLACEMENT not in x for x in deltas)
    assert "".join(deltas) == "！"


def test_flush_drops_incomplete_trailing_character(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode("ok 🌊", add_special_tokens=False)
    deltas = stream(tok, [], ids[:-1])  # generation cut inside the emoji
    assert "".join(deltas) == "ok "
    assert all(REPLACEMENT not in d for d in deltas)


# -- StopStringMatcher ------------------------------------------------------------------------------

def run(stops, deltas):
    m = StopStringMatcher(stops)
    outs, stopped = [], False
    for d in deltas:
        out, stopped = m.push(d)
        outs.append(out)
        if stopped:
            break
    if not stopped:
        outs.append(m.flush())
    return outs, stopped


def test_stop_string_across_deltas_is_not_emitted():
    outs, stopped = run(["STOP"], ["abc S", "TO", "P more text"])
    assert stopped
    assert outs == ["abc ", "", ""]
    assert "".join(outs) == "abc "


def test_stop_string_inside_one_delta_cuts_before_it():
    outs, stopped = run(["END"], ["hello world END tail"])
    assert stopped and outs == ["hello world "]


def test_partial_prefix_held_back_then_released():
    m = StopStringMatcher(["<end>"])
    assert m.push("value <e") == ("value ", False)   # "<e" could start "<end>"
    assert m.push("n") == ("", False)                 # "<en" still could
    assert m.push("x!") == ("<enx!", False)           # no longer: released
    assert m.flush() == ""


def test_no_stop_everything_flushed():
    deltas = ["The sto", "p sign is r", "ed. s", "t"]
    outs, stopped = run(["stop!", "xyz"], deltas)
    assert not stopped
    assert outs == ["The ", "stop sign is r", "ed. ", "", "st"]  # "sto", "s", "st" held back as prefixes
    assert "".join(outs) == "".join(deltas)


def test_no_stops_passthrough():
    m = StopStringMatcher([])
    assert m.push("abc") == ("abc", False)
    assert m.push("") == ("", False)
    assert m.flush() == ""


def test_earliest_of_several_stops_wins():
    outs, stopped = run(["world", "lo w"], ["hello world"])
    assert stopped and outs == ["hel"]


def test_stop_at_very_start_emits_nothing():
    outs, stopped = run(["\n\n"], ["\n", "\nafter"])
    assert stopped and "".join(outs) == ""
