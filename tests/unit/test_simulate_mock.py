"""The mock OpenAI-compatible deployments: they serve, stream, follow their behaviour, fail as told, repeat."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from litellm_ratebalance.simulate import Behaviour, Change, DeploymentSpec, MockCluster, behaviour_at
from litellm_ratebalance.simulate.mock_openai import UsageWindow, estimate_prompt_tokens

FAST = Behaviour(token_rate=2000.0, base_latency=0.0, jitter=0.0)
"""Quick enough that tests do not wait on the simulated decode."""


def _body(prompt_chars: int = 40, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "x" * prompt_chars}],
        "max_tokens": max_tokens,
        **extra,
    }


async def _post(client: httpx.AsyncClient, base: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return await client.post(base + "/chat/completions", json=body, headers=headers, timeout=10)


async def test_serves_a_chat_completion_with_usage() -> None:
    async with MockCluster([DeploymentSpec("a", FAST)]) as cluster, httpx.AsyncClient() as client:
        assert cluster.api_bases["a"].startswith("http://127.0.0.1:")
        response = await _post(client, cluster.api_bases["a"], _body(prompt_chars=40, max_tokens=8))
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["usage"] == {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}
    assert data["choices"][0]["message"]["role"] == "assistant"
    assert response.headers["x-mock-deployment"] == "a"


async def test_streams_sse_chunks_and_a_final_usage_chunk() -> None:
    body = _body(max_tokens=12, stream=True, stream_options={"include_usage": True})
    async with MockCluster([DeploymentSpec("a", FAST)]) as cluster, httpx.AsyncClient() as client:
        response = await _post(client, cluster.api_bases["a"], body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content.count("tok") == 12
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12


async def test_stream_without_include_usage_sends_no_usage_chunk() -> None:
    async with MockCluster([DeploymentSpec("a", FAST)]) as cluster, httpx.AsyncClient() as client:
        response = await _post(client, cluster.api_bases["a"], _body(stream=True))
    assert "usage" not in response.text


async def test_latency_follows_token_rate_and_base_latency() -> None:
    behaviour = Behaviour(token_rate=100.0, base_latency=0.1, jitter=0.0)
    async with MockCluster([DeploymentSpec("a", behaviour)]) as cluster, httpx.AsyncClient() as client:
        started = time.perf_counter()
        await _post(client, cluster.api_bases["a"], _body(max_tokens=20))  # 0.1 s + 20 / 100 s
        elapsed = time.perf_counter() - started
    assert 0.28 <= elapsed < 1.5  # (the upper bound only catches gross errors: a loaded machine is slow)


async def test_requests_beyond_capacity_share_it() -> None:
    behaviour = Behaviour(token_rate=100.0, base_latency=0.0, jitter=0.0, capacity=1)
    async with MockCluster([DeploymentSpec("a", behaviour)]) as cluster, httpx.AsyncClient() as client:
        started = time.perf_counter()
        await asyncio.gather(*(_post(client, cluster.api_bases["a"], _body(max_tokens=10)) for _ in range(3)))
        elapsed = time.perf_counter() - started
    # alone: 0.1 s each; three sharing one slot run at a third of the speed
    assert 0.27 <= elapsed < 1.5


async def test_timeline_and_update_change_behaviour() -> None:
    spec = DeploymentSpec("a", FAST, timeline=(Change(0.0, {"rate_limited": True}),))
    async with MockCluster([spec]) as cluster, httpx.AsyncClient() as client:
        assert (await _post(client, cluster.api_bases["a"], _body())).status_code == 429
        cluster["a"].update(rate_limited=False)
        assert (await _post(client, cluster.api_bases["a"], _body())).status_code == 200
        with pytest.raises(ValueError, match="unknown Behaviour fields"):
            cluster["a"].update(no_such_field=1)


async def test_rate_limit_burst_answers_429_with_retry_after_and_remaining_headers() -> None:
    behaviour = Behaviour(token_rate=2000.0, base_latency=0.0, rate_limited=True, retry_after=3.0, tpm=1000, rpm=10)
    async with MockCluster([DeploymentSpec("a", behaviour)]) as cluster, httpx.AsyncClient() as client:
        response = await _post(client, cluster.api_bases["a"], _body())
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    assert response.headers["x-ratelimit-remaining-tokens"] == "0"
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"


async def test_token_budget_counts_down_then_refuses() -> None:
    # each request charges 10 prompt + 40 output tokens against a 120-token budget
    behaviour = Behaviour(token_rate=4000.0, base_latency=0.0, jitter=0.0, tpm=120, limit_window=60.0)
    async with MockCluster([DeploymentSpec("a", behaviour)]) as cluster, httpx.AsyncClient() as client:
        base = cluster.api_bases["a"]
        first = await _post(client, base, _body(max_tokens=40))
        second = await _post(client, base, _body(max_tokens=40))
        third = await _post(client, base, _body(max_tokens=40))
    assert first.headers["x-ratelimit-remaining-tokens"] == "70"
    assert second.headers["x-ratelimit-remaining-tokens"] == "20"
    assert third.status_code == 429
    assert int(third.headers["retry-after"]) >= 1


async def test_error_rate_answers_5xx() -> None:
    behaviour = Behaviour(token_rate=2000.0, base_latency=0.0, error_rate=1.0, error_status=503, error_latency=0.0)
    async with MockCluster([DeploymentSpec("a", behaviour)]) as cluster, httpx.AsyncClient() as client:
        response = await _post(client, cluster.api_bases["a"], _body())
    assert response.status_code == 503
    assert cluster["a"].served()[0].outcome == "error"


async def test_stall_hangs_until_the_client_gives_up() -> None:
    behaviour = Behaviour(token_rate=2000.0, base_latency=0.0, stall_rate=1.0, stall_seconds=30.0)
    async with MockCluster([DeploymentSpec("a", behaviour)]) as cluster, httpx.AsyncClient() as client:
        started = time.perf_counter()
        with pytest.raises(httpx.ReadTimeout):
            await client.post(cluster.api_bases["a"] + "/chat/completions", json=_body(), timeout=0.3)
        assert time.perf_counter() - started < 1.0
        for _ in range(50):  # the server notices the closed connection and logs the request as cancelled
            if cluster["a"].served():
                break
            await asyncio.sleep(0.02)
    assert [r.outcome for r in cluster["a"].served()] == ["cancelled"]


async def test_same_seed_same_fates_and_reset_replays_them() -> None:
    behaviour = Behaviour(token_rate=4000.0, base_latency=0.0, error_rate=0.5, error_latency=0.0, jitter=0.0)

    async def statuses(cluster: MockCluster, client: httpx.AsyncClient) -> list[int]:
        return [(await _post(client, cluster.api_bases["a"], _body(max_tokens=2))).status_code for _ in range(16)]

    async with httpx.AsyncClient() as client:
        async with MockCluster([DeploymentSpec("a", behaviour, seed=7)]) as one:
            first = await statuses(one, client)
            one.reset()
            replay = await statuses(one, client)
        async with MockCluster([DeploymentSpec("a", behaviour, seed=7)]) as two:
            again = await statuses(two, client)
        async with MockCluster([DeploymentSpec("a", behaviour, seed=8)]) as three:
            other = await statuses(three, client)
    assert first == replay == again
    assert set(first) == {200, 500}
    assert other != first


async def test_served_log_records_request_ids() -> None:
    async with MockCluster([DeploymentSpec("a", FAST), DeploymentSpec("b", FAST)]) as cluster:
        async with httpx.AsyncClient() as client:
            await _post(client, cluster.api_bases["b"], _body(), **{"x-bench-request-id": "42"})
        records = cluster.served()
    assert [(r.deployment, r.request_id, r.status) for r in records] == [("b", "42", 200)]


def test_behaviour_at_applies_changes_in_time_order() -> None:
    base = Behaviour(token_rate=10.0)
    timeline = [Change(5.0, {"token_rate": 30.0}), Change(2.0, {"token_rate": 20.0, "capacity": 3})]
    assert behaviour_at(base, timeline, 1.0).token_rate == 10.0
    assert behaviour_at(base, timeline, 2.0).token_rate == 20.0
    assert behaviour_at(base, timeline, 9.0) == Behaviour(token_rate=30.0, capacity=3)


def test_rate_wave_and_validation() -> None:
    wave = Behaviour(token_rate=100.0, wave_amplitude=0.5, wave_period=4.0)
    assert wave.rate_at(1.0) == pytest.approx(150.0)
    assert wave.rate_at(3.0) == pytest.approx(50.0)
    with pytest.raises(ValueError, match="error_rate must be between 0 and 1"):
        Behaviour(error_rate=1.5)
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        Behaviour(capacity=0)


def test_spec_round_trips_through_json() -> None:
    spec = DeploymentSpec("a", Behaviour(token_rate=33.0, tpm=500), (Change(1.5, {"rate_limited": True}),), seed=3)
    assert DeploymentSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_usage_window_and_prompt_estimate() -> None:
    window = UsageWindow()
    window.charge(0.0, 100)
    window.charge(5.0, 50)
    assert window.usage(9.0, 10.0) == (2, 150)
    assert window.usage(10.0, 10.0) == (1, 50)
    assert window.seconds_until_free(10.0, 10.0) == pytest.approx(5.0)
    assert estimate_prompt_tokens([{"role": "user", "content": "abcde"}]) == 2
    assert estimate_prompt_tokens([]) == 1


async def test_a_body_without_messages_is_a_400() -> None:
    async with MockCluster([DeploymentSpec("a", FAST)]) as cluster, httpx.AsyncClient() as client:
        response = await _post(client, cluster.api_bases["a"], {"model": "m"})
        broken = await client.post(cluster.api_bases["a"] + "/chat/completions", content=b"{not json", timeout=5)
    assert response.status_code == 400 and broken.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_answer_length_follows_the_prompt_tag_capped_by_max_tokens() -> None:
    tagged = [{"role": "user", "content": "[answer:30] " + "x" * 40}]
    async with MockCluster([DeploymentSpec("a", FAST)]) as cluster, httpx.AsyncClient() as client:
        base = cluster.api_bases["a"]
        uncapped = (await _post(client, base, {"model": "m", "messages": tagged})).json()
        loose = (await _post(client, base, {"model": "m", "messages": tagged, "max_tokens": 4096})).json()
        cut = (await _post(client, base, {"model": "m", "messages": tagged, "max_tokens": 12})).json()
        untagged = (await _post(client, base, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})).json()
    assert uncapped["usage"]["completion_tokens"] == 30 and uncapped["choices"][0]["finish_reason"] == "stop"
    assert loose["usage"]["completion_tokens"] == 30 and loose["choices"][0]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] == 12 and cut["choices"][0]["finish_reason"] == "length"
    assert untagged["usage"]["completion_tokens"] == FAST.default_max_tokens


def test_answer_length_reads_text_parts_and_ignores_bad_max_tokens() -> None:
    from litellm_ratebalance.simulate.mock_openai import answer_length, answer_tag, tagged_answer_tokens

    parts = [{"role": "user", "content": [{"type": "text", "text": answer_tag(7) + " hello"}]}]
    assert tagged_answer_tokens(parts) == 7
    assert tagged_answer_tokens("not a list") is None
    assert answer_length(parts, None, 64) == (7, False)
    assert answer_length(parts, 7, 64) == (7, True)
    assert answer_length([{"role": "user", "content": "hi"}], "x", 64) == (64, False)
