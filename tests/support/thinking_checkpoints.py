"""Tiny random-weight thinking models of three families, for the reasoning tests.

make_thinking_checkpoint(family, out_dir) writes a checkpoint folder whose tokenizer carries the
family's special tokens (`<think>`, `</think>`, the chat markers, the tool-call tags) and a chat
template of the same shape as the family's released one:
  qwen3        Qwen3 (model_type qwen3): ChatML turns, `tools` in the system turn, the generation
               prompt `<|im_start|>assistant\\n` (the model opens `<think>` itself) and, with
               enable_thinking=false, an empty closed span `<think>\\n\\n</think>\\n\\n` (Qwen3's hybrid
               template); `<think>` / `</think>` are added tokens that are not special, as in Qwen3.
  ernie45      ERNIE-4.5 thinking (model_type ernie4_5): the generation prompt opens the span
               (`<|im_start|>assistant\\n<think>\\n`), no switch to turn thinking off; its markers are
               flagged special here (so skip_special_tokens would hide them: the engine keeps them).
  deepseek_r1  a DeepSeek-R1 distill on Qwen2 (model_type qwen2): `<｜User｜>` / `<｜Assistant｜>` turns,
               history answers cut after `</think>`, the generation prompt `<｜Assistant｜><think>\\n`.
`<tool_call>` / `</tool_call>` stay plain text here (the released Qwen3 / ERNIE tokenizers have them
as added tokens): llguidance 1.9.1 lets a forced-call grammar's mask allow the added `<tool_call>`
token and then refuses it when consumed ("token doesn't satisfy the grammar"), with or without a
reasoning parser, which would end every forced call at its first token.
The tokenizer is byte-level BPE without merges (every byte one token, so any text, non-ASCII
included, encodes; a UTF-8 character of several bytes spans several tokens), plus the added tokens;
the model's vocabulary is exactly the tokenizer's, so every id a random model samples decodes.
Weights: tests/support/tiny_checkpoints.py's family weights (qwen3, ernie4_5, qwen2) at this
vocabulary size. The random model never thinks on its own: tests steer it with logit_bias and the
engine's budget forcing.
"""

from __future__ import annotations

import json
from pathlib import Path

import tiny_checkpoints as tc

FAMILIES = ("qwen3", "ernie45", "deepseek_r1")

_QWEN3_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content or '' %}{%- set reasoning_content = message.reasoning_content or '' %}"
    "{%- if not reasoning_content and '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if loop.last and reasoning_content %}{{- '<think>\\n' + reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- content }}"
    "{%- if message.tool_calls %}{%- for tc in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' + (tc.function.arguments | tojson)"
    " + '}\\n</tool_call>' }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

_ERNIE_TEMPLATE = (
    "{{- '<|begin_of_sentence|>' }}"
    "{%- if tools %}{{- '<|im_start|>system\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}"
    "{%- endfor %}{{- '\\n</tools>\\nCall a tool as <tool_call>\\n{\"name\": ..., \"arguments\": {...}}\\n</tool_call>"
    "<|im_end|>\\n\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role in ('system', 'user') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = (message.content or '').split('</think>')[-1].lstrip('\\n') %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- if message.tool_calls %}{%- for tc in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' + (tc.function.arguments | tojson)"
    " + '}\\n</tool_call>' }}{%- endfor %}{%- endif %}"
    "{{- '<|end_of_sentence|>\\n\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)

_R1_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}{%- if message.role == 'system' %}{{- message.content }}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '<｜User｜>' + message.content }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<｜Assistant｜>' + (message.content or '').split('</think>')[-1] + '<｜end▁of▁sentence｜>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<｜Assistant｜><think>\\n' }}{%- endif %}"
)

# family -> (weights family of tiny_checkpoints, added tokens [(text, special)], eos, bos, template)
_SPECS = {
    "qwen3": ("qwen3", [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                        ("<think>", False), ("</think>", False), ("<tool_response>", False),
                        ("</tool_response>", False)],
              "<|im_end|>", None, _QWEN3_TEMPLATE),
    "ernie45": ("ernie4_5", [("<|begin_of_sentence|>", True), ("<|end_of_sentence|>", True), ("<|im_start|>", True),
                             ("<|im_end|>", True), ("<think>", True), ("</think>", True), ("<response>", False),
                             ("</response>", False), ("<tool_response>", False), ("</tool_response>", False)],
                "<|end_of_sentence|>", "<|begin_of_sentence|>", _ERNIE_TEMPLATE),
    "deepseek_r1": ("qwen2", [("<｜begin▁of▁sentence｜>", True), ("<｜end▁of▁sentence｜>", True), ("<｜User｜>", False),
                              ("<｜Assistant｜>", False), ("<think>", False), ("</think>", False)],
                    "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", _R1_TEMPLATE),
}


def _byte_alphabet() -> list[str]:
    """The 256 printable stand-ins of byte-level BPE (bytes that are printable map to themselves,
    the others to code points from 256 up), in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def tokenizer_files(family: str) -> tuple[dict, dict, dict[str, int]]:
    """(tokenizer.json, tokenizer_config.json, {added token: id}) of the family."""
    _, added, eos, bos, template = _SPECS[family]
    vocab = {ch: i for i, ch in enumerate(_byte_alphabet())}
    ids = {text: 256 + k for k, (text, _) in enumerate(added)}
    tok = {"version": "1.0", "truncation": None, "padding": None, "normalizer": None,
           "added_tokens": [{"id": ids[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": sp} for t, sp in added],
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": []}}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "pad_token": eos,
           "model_max_length": 2048, "chat_template": template, "clean_up_tokenization_spaces": False,
           "added_tokens_decoder": {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                                  "single_word": False, "special": sp} for t, sp in added}}
    if bos:
        cfg["bos_token"] = bos
    return tok, cfg, ids


def make_thinking_checkpoint(family: str, out_dir: str | Path) -> Path:
    """Write the family's checkpoint folder (created) and return it."""
    from safetensors.numpy import save_file

    weights_family = _SPECS[family][0]
    tok, cfg, ids = tokenizer_files(family)
    vocab = 256 + len(ids)
    eos = ids[_SPECS[family][2]]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tc.make_weights(weights_family, vocab=vocab), str(out / "model.safetensors"))
    config = tc.config_json(weights_family, vocab=vocab)
    # room for chat prompts with tools (byte-level: one token per byte)
    config.update(eos_token_id=eos, bos_token_id=ids.get(_SPECS[family][3] or "", eos), max_position_embeddings=2048)
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}) + "\n")
    (out / "tokenizer.json").write_text(json.dumps(tok, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out
