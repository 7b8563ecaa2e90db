"""Prompt tokens before the call: plain-text chat is counted directly, and agrees with LiteLLM's counter."""

from __future__ import annotations

from typing import Any

import pytest

from litellm_ratebalance.proxy import tokens

LONG = "The deployment answered quickly; the next one, slowly. " * 80  # several of LiteLLM's 1,024-char pieces

PLAIN: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hello there"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 2 + 2?"}],
    [{"role": "user", "content": "hi", "name": "bob"}],
    [{"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}],
    [{"role": "assistant", "content": None}, {"role": "user", "content": "go on"}],
    [{"role": "user", "content": "日本語のテキスト、そして絵文字 🙂"}],
    [],
]


def litellm_count(model: str, messages: list[dict[str, Any]]) -> int:
    import litellm

    return int(litellm.token_counter(model=model, messages=messages, custom_tokenizer=tokens._tokenizer(model)))


@pytest.mark.parametrize("model", ["gpt-4o-mini", "my-model-group", "gpt-4"])
@pytest.mark.parametrize("messages", PLAIN)
def test_plain_chat_is_counted_as_litellm_counts_it(model: str, messages: list[dict[str, Any]]) -> None:
    counter = tokens._string_counter(model)
    assert counter is not None
    assert tokens._plain_chat_tokens(counter, messages) == litellm_count(model, messages)
    assert tokens._count_prompt_tokens(model, {"messages": messages}) == litellm_count(model, messages)


def test_a_long_string_is_counted_whole_within_a_few_tokens_of_litellm() -> None:
    messages = [{"role": "user", "content": LONG}]
    ours = tokens._count_prompt_tokens("gpt-4o-mini", {"messages": messages})
    theirs = litellm_count("gpt-4o-mini", messages)
    assert ours > 500 and abs(ours - theirs) <= 0.01 * theirs


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}],
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            }
        ],
    ],
)
def test_anything_but_plain_text_is_left_to_litellm(messages: list[dict[str, Any]]) -> None:
    counter = tokens._string_counter("gpt-4o-mini")
    assert counter is not None
    assert tokens._plain_chat_tokens(counter, messages) is None


def test_a_tool_call_is_priced_through_litellms_counter() -> None:
    messages = [
        {"role": "user", "content": "call it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
    ]
    assert tokens._count_prompt_tokens("gpt-4o-mini", {"messages": messages}) == litellm_count("gpt-4o-mini", messages)


def test_the_count_is_cached_in_the_request_metadata() -> None:
    data: dict[str, Any] = {"messages": [{"role": "user", "content": "hello there"}]}
    first = tokens.prompt_tokens("gpt-4o-mini", data)
    data["messages"][0]["content"] = "changed after the first count " * 10
    assert tokens.prompt_tokens("gpt-4o-mini", data) == first
