"""Estimating a request's token cost before the call (what the admission reservation holds)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["estimate_tokens", "message_text_chars", "requested_output_tokens"]

logger = logging.getLogger("litellm_ratebalance")

TokenType = Literal["input", "output", "total"]


_OUTPUT_LIMIT_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
"""The request keys of an output-token limit, in order: the first with a valid value wins."""


def requested_output_tokens(data: Mapping[str, Any], default: int, ceiling: int) -> int:
    """``max_completion_tokens`` or ``max_tokens`` from the request, else ``default``; at most ``ceiling``.

    A value that is not a non-negative integer is ignored (the provider will refuse it anyway), so a bad
    request cannot make the reservation negative or huge.
    """
    for name in _OUTPUT_LIMIT_KEYS:
        value = data.get(name)
        # (type() first: the value is a plain int or absent, and the routing hook reads it on every request)
        if (type(value) is int or (isinstance(value, int) and not isinstance(value, bool))) and value >= 0:
            return min(value, ceiling)
    return min(default, ceiling)


def message_text_chars(messages: object) -> int:
    """Characters of the text in chat ``messages``: string contents and the ``text`` of content parts (other
    parts, images or tool calls, are not counted). For cheap size estimates where tokenising costs too much."""
    chars = 0
    if isinstance(messages, list):
        for message in messages:
            # (type() first: messages are plain dicts, and an ABC isinstance costs more than the sum)
            content = message.get("content") if type(message) is dict or isinstance(message, Mapping) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                for part in content:
                    text = part.get("text") if type(part) is dict or isinstance(part, Mapping) else None
                    if isinstance(text, str):
                        chars += len(text)
    return chars


_PROMPT_TOKENS_KEY = "ratebalance_prompt_tokens"
"""Request-metadata key caching the prompt count, so the limiter and the contracts count it once."""


def prompt_tokens(model: str, data: Mapping[str, Any]) -> int:
    """Input tokens by LiteLLM's token counter (chat messages, a text prompt or embedding input).

    The count is cached in the request's metadata: every part that needs it in one request's pre-call
    hooks pays for tokenising once.
    """
    metadata = data.get("metadata")
    if isinstance(metadata, dict):
        cached = metadata.get(_PROMPT_TOKENS_KEY)
        if isinstance(cached, int):
            return cached
    count = _count_prompt_tokens(model, data)
    if isinstance(metadata, dict):
        metadata[_PROMPT_TOKENS_KEY] = count
    elif isinstance(data, dict) and metadata is None:
        data["metadata"] = {_PROMPT_TOKENS_KEY: count}
    return count


@functools.lru_cache(maxsize=256)
def _tokenizer(model: str) -> Any:
    """LiteLLM's tokenizer choice for a model name, looked up once per name (it costs as much as counting a
    short prompt); bounded, since request model names are not all configured ones."""
    from litellm.utils import select_tokenizer

    return select_tokenizer(model)


def _count_prompt_tokens(model: str, data: Mapping[str, Any]) -> int:
    import litellm

    try:
        tokenizer = _tokenizer(model)
        messages = data.get("messages")
        if isinstance(messages, list):
            return int(litellm.token_counter(model=model, messages=messages, custom_tokenizer=tokenizer))
        for name in ("prompt", "input"):
            text = data.get(name)
            if isinstance(text, str) or (isinstance(text, list) and all(isinstance(item, str) for item in text)):
                return int(litellm.token_counter(model=model, text=text, custom_tokenizer=tokenizer))
    except Exception as exc:  # an unusual payload must not fail the request; reserve output only
        logger.debug("litellm_ratebalance: token counting failed (%s); reserving output tokens only", exc)
    return 0


def estimate_tokens(
    model: str, data: Mapping[str, Any], token_type: TokenType, default_output: int, output_ceiling: int
) -> int:
    """Tokens to reserve, counting what ``token_rate_limit_type`` counts (input, output or total)."""
    total = 0
    if token_type in ("input", "total"):
        total += prompt_tokens(model, data)
    if token_type in ("output", "total"):
        total += requested_output_tokens(data, default_output, output_ceiling)
    return total


def actual_tokens(usage: Mapping[str, Any], token_type: TokenType) -> int | None:
    """Tokens a finished call used, from a usage mapping; ``None`` if it carries none."""
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    total = usage.get("total_tokens")
    if token_type == "input":
        return int(prompt) if isinstance(prompt, int | float) else None
    if token_type == "output":
        return int(completion) if isinstance(completion, int | float) else None
    if isinstance(total, int | float) and total > 0:
        return int(total)
    if isinstance(prompt, int | float) or isinstance(completion, int | float):
        return int(prompt or 0) + int(completion or 0)
    return None


_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")


def usage_of(kwargs: Mapping[str, Any], response_obj: Any) -> Mapping[str, Any]:
    """The usage of a finished call from LiteLLM's logging kwargs (standard_logging_object first), else from
    the response object; empty when neither carries any."""
    slo = kwargs.get("standard_logging_object")
    if isinstance(slo, Mapping) and slo.get("total_tokens") is not None:
        return {name: slo.get(name) for name in _USAGE_FIELDS}
    usage = getattr(response_obj, "usage", None)
    if usage is None and isinstance(response_obj, Mapping):
        usage = response_obj.get("usage")
    if usage is None:
        return {}
    if isinstance(usage, Mapping):
        return usage
    return {name: getattr(usage, name, None) for name in _USAGE_FIELDS}
