"""Request bodies of /v1/completions and /v1/chat/completions (pydantic; OpenAI's names and types).

Unknown fields are refused (400, as OpenAI does: "Unrecognized request argument supplied"); the
fields OpenAI defines that this server does not implement are declared here and refused with a
reason in params.py (REFUSED), or accepted and ignored (IGNORED). Fields beyond OpenAI's are vLLM's
extensions of the same name (top_k, min_p, repetition_penalty, ignore_eos, min_tokens,
skip_special_tokens, stop_token_ids, include_stop_str_in_output, add_generation_prompt,
chat_template_kwargs), and the thinking budget (reasoning_max_tokens, FastDeploy's name;
thinking_token_budget, vLLM's). Ranges are checked by `llm` (the engine's rules) and by params.py for the
OpenAI-only ones (n, logprobs, top_logprobs).
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: Optional[bool] = False
    include_obfuscation: Optional[bool] = None  # accepted and ignored (no obfuscation padding)
    continuous_usage_stats: Optional[bool] = False  # vLLM: usage on every chunk


class _Common(BaseModel):
    """Fields both endpoints take."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    n: Optional[int] = 1
    stop: Optional[Union[str, List[str]]] = None
    seed: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[Dict[str, float]] = None
    user: Optional[str] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    response_format: Optional[Dict[str, Any]] = None
    # vLLM's extensions
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    ignore_eos: Optional[bool] = None
    min_tokens: Optional[int] = None
    skip_special_tokens: Optional[bool] = None
    stop_token_ids: Optional[List[int]] = None
    include_stop_str_in_output: Optional[bool] = None
    # scheduling priority, a lower value first (acts under the engine's scheduling_policy "priority")
    priority: Optional[int] = None
    # thinking models: one budget under FastDeploy's and vLLM's names (paddle_llm_openai/reasoning.py)
    reasoning_max_tokens: Optional[int] = None
    thinking_token_budget: Optional[int] = None
    # accepted and ignored
    metadata: Optional[Dict[str, Any]] = None
    store: Optional[bool] = None
    service_tier: Optional[str] = None


class CompletionRequest(_Common):
    prompt: Union[str, List[str], List[int], List[List[int]]]
    echo: Optional[bool] = False
    logprobs: Optional[int] = None
    best_of: Optional[int] = None
    suffix: Optional[str] = None


class ChatCompletionRequest(_Common):
    messages: List[Dict[str, Any]]
    max_completion_tokens: Optional[int] = None
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = None
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None  # checked by tools.check_tools
    parallel_tool_calls: Optional[bool] = None
    add_generation_prompt: Optional[bool] = True
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    reasoning_effort: Optional[str] = None  # reasoning.py maps it
    # refused with a reason (params.REFUSED)
    functions: Optional[List[Dict[str, Any]]] = None
    function_call: Optional[Union[str, Dict[str, Any]]] = None
    audio: Optional[Dict[str, Any]] = None
    modalities: Optional[List[str]] = None
    prediction: Optional[Dict[str, Any]] = None
    web_search_options: Optional[Dict[str, Any]] = None
    verbosity: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    safety_identifier: Optional[str] = None


class TokenizeRequest(BaseModel):
    """vLLM's POST /tokenize: `prompt` (completion form) or `messages` (chat form, rendered with the
    chat template like /v1/chat/completions), not both. add_special_tokens defaults as vLLM's: True
    for a prompt, False for messages (the template writes the special tokens itself)."""

    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[List[Dict[str, Any]]] = None
    add_generation_prompt: Optional[bool] = True
    add_special_tokens: Optional[bool] = None
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    tools: Optional[List[Dict[str, Any]]] = None
    return_token_strs: Optional[bool] = False


class DetokenizeRequest(BaseModel):
    """vLLM's POST /detokenize: token ids -> text."""

    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None
    tokens: List[int]


class ModelCard(BaseModel):
    """GET /v1/models entry. A LoRA adapter's (lora.py) has vLLM's `root` (its folder as given) and
    `parent` (the base model's name); a base model's leave them null."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "paddle-llm"
    root: Optional[str] = None
    parent: Optional[str] = None


class LoadLoraAdapterRequest(BaseModel):
    """vLLM's POST /v1/load_lora_adapter body (lora.py); missing names are answered with vLLM's 400."""

    model_config = ConfigDict(extra="forbid")
    lora_name: Optional[str] = None
    lora_path: Optional[str] = None
    load_inplace: Optional[bool] = False


class UnloadLoraAdapterRequest(BaseModel):
    """vLLM's POST /v1/unload_lora_adapter body; lora_int_id (vLLM's engine id) is accepted and
    ignored: adapters are unloaded by name."""

    model_config = ConfigDict(extra="forbid")
    lora_name: Optional[str] = None
    lora_int_id: Optional[int] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: List[ModelCard] = Field(default_factory=list)
