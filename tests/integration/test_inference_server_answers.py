"""The simulated inference server's natural answer lengths (``ServerSpec.answer_tokens``): a request stops at
its prompt's answer length or at its max_tokens, whichever comes first, and runs to its natural end without
max_tokens; without ``answer_tokens`` it generates exactly max_tokens, as before."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from litellm_ratebalance.simulate.inference_server import InferenceServer, ServerSpec, answer_length


async def complete(server: InferenceServer, messages: list[dict[str, Any]], **extra: Any) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        body = {"model": "sim", "messages": messages, **extra}
        async with session.post(server.api_base + "/chat/completions", json=body) as response:
            data = await response.json()
    assert response.status == 200, data
    return int(data["usage"]["completion_tokens"]), str(data["choices"][0]["finish_reason"])


async def test_answers_stop_at_their_natural_length_or_max_tokens() -> None:
    spec = ServerSpec(knee=64, step_seconds=0.0005, answer_tokens=(5, 40))
    prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(12)]
    lengths = [answer_length(spec, messages) for messages in prompts]
    assert all(length is not None and 5 <= length <= 40 for length in lengths)
    assert len(set(lengths)) > 1  # the range is used, not one value
    async with InferenceServer(spec) as server:
        for messages, natural in zip(prompts, lengths, strict=True):
            assert natural is not None
            assert await complete(server, messages) == (natural, "stop")
            assert await complete(server, messages, max_tokens=1000) == (natural, "stop")
            assert await complete(server, messages, max_tokens=3) == (
                min(3, natural),
                "stop" if natural <= 3 else "length",
            )


async def test_without_answer_tokens_every_request_generates_its_max_tokens() -> None:
    spec = ServerSpec(knee=64, step_seconds=0.0005, default_max_tokens=7)
    assert answer_length(spec, [{"role": "user", "content": "q"}]) is None
    async with InferenceServer(spec) as server:
        assert await complete(server, [{"role": "user", "content": "q"}], max_tokens=11) == (11, "length")
        assert await complete(server, [{"role": "user", "content": "q"}]) == (7, "length")


def test_answer_tokens_must_be_an_ordered_positive_range() -> None:
    with pytest.raises(ValueError, match="answer_tokens"):
        ServerSpec(answer_tokens=(10, 5))
    assert ServerSpec.from_dict(ServerSpec(answer_tokens=(2, 9)).to_dict()).answer_tokens == (2, 9)
