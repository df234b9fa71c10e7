"""vLLM's POST /tokenize and /detokenize on this frontend, with the tokenizer and chat template of the
model folder it serves (chat_template.ChatRenderer).

- tokenize(fe, req) -> {"count": int, "max_model_len": int | None, "tokens": [int], "token_strs":
  [str] | None}: the token ids of `prompt`, or of `messages` rendered as /v1/chat/completions renders
  them (tools and chat_template_kwargs included), so `count` is what the model will be given.
- detokenize(fe, req) -> {"prompt": str}: the text of `tokens` (special tokens kept, as vLLM does).
Errors: 400 naming the field (`prompt` / `messages` both or neither, a token id outside the vocabulary,
a model name this frontend does not serve, a message the template refuses).
"""

from __future__ import annotations

from paddle_llm_openai import params
from paddle_llm_openai.errors import bad_param
from paddle_llm_openai.protocol import DetokenizeRequest, TokenizeRequest


def tokenize(fe, req: TokenizeRequest) -> dict:
    from paddle_llm_openai.chat_template import ChatTemplateError

    if req.model is not None:  # a LoRA adapter shares the base model's tokenizer
        params.check_model(fe.served_names + fe.lora.cached_names(), req.model)
    if (req.prompt is None) == (req.messages is None):
        raise bad_param("prompt", "send either `prompt` or `messages`")
    renderer = fe.renderer
    if req.messages is not None:
        try:
            text = renderer.render(req.messages, req.tools, bool(req.add_generation_prompt), req.chat_template_kwargs)
        except ChatTemplateError as e:
            raise bad_param(e.param, e.message) from None
        special = bool(req.add_special_tokens)
    else:
        text = req.prompt
        special = True if req.add_special_tokens is None else bool(req.add_special_tokens)
    ids = [int(t) for t in renderer.tokenizer.encode(text, add_special_tokens=special)]
    strs = renderer.tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": fe.max_model_len(), "tokens": ids, "token_strs": strs}


def detokenize(fe, req: DetokenizeRequest) -> dict:
    if req.model is not None:
        params.check_model(fe.served_names + fe.lora.cached_names(), req.model)
    tok = fe.renderer.tokenizer
    size = len(tok)
    bad = [t for t in req.tokens if not 0 <= t < size]
    if bad:
        raise bad_param("tokens", f"token ids must be in [0, {size}), got {bad[:5]}")
    return {"prompt": tok.decode(req.tokens)}
