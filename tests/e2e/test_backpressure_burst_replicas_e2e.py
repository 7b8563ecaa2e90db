"""A burst of 200 requests at once through two real ``litellm`` proxy replicas sharing one redis-server, in
front of one simulated vLLM-like server (knee 12, a 3,000-token KV cache whose overflow fails every running
request): the replicas protect the server as one, and a top-tier request waiting in one replica holds back
the lower tier in the other.

Set-up: two proxies with ``litellm_ratebalance.backpressure`` and the defaults (learned output estimate,
adaptive limit), tiers ``[dev, prod]``, the queue on (10 s), and the backpressure trace
(``LITELLM_RATEBALANCE_BACKPRESSURE_TRACE``) written by both to one file, which tells when each replica took
a lease, queued a request or refused one.

The burst: 160 lower-tier requests split between the replicas and 40 top-tier ones all to the first, sent at
once (a third of each without ``max_tokens``), then lower-tier requests to the second replica every 0.1 s for
4 s while the top tier waits in the first. Checked:

* no simulated out-of-memory failure, every answer a 200 or a backpressure refusal, the top tier served;
* the top tier waited in the first replica's queue, and lower-tier requests reached the second replica (whose
  own queue stays empty) meanwhile;
* the first replica published the top tier's wait to the store as the first top-tier request queued
  (sent within 0.05 s of its enqueue: the request publishes it itself; before, only the queue's dispatcher
  did, 0.16-1.2 s late in this burst);
* no lower-tier lease acquire that the second replica sent while the store held the top tier's wait (from a
  publication's write until the next publication was sent, at most its 3 s time-to-live) was granted. The
  trace gives each acquire's send time, so an acquire that left before the publication and whose reply was
  read late is not mistaken for one that slipped through.
* afterwards the shared counts are exact: no lease in flight, no reserved token, no live waiting entry (the
  empty queue was published, its last publication empty), and no store error logged by either replica.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from litellm_ratebalance.overload.peers import WAITING_TTL_SECONDS
from litellm_ratebalance.proxy.backpressure.trace import TRACE_ENV
from litellm_ratebalance.simulate.inference_server import ServerSpec
from litellm_ratebalance.store import KeySpace, RedisStore
from tests.e2e.bursts import assert_no_store_errors
from tests.e2e.conftest import StartProxies
from tests.e2e.harness import LiteLLMProxy, inference_server_process
from tests.servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow]

PREFIX = "e2e-bp-burst"
SERVER = ServerSpec(knee=12, step_seconds=0.02, max_num_seqs=64, memory_tokens=3000, answer_tokens=(50, 300))
WORDS = ("the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was", "one")
PUBLISH_MARGIN_SECONDS = 0.05
"""How soon after the first top-tier request queues its wait must be sent to the store. Measured: 0.2 ms when
the request publishes it itself (no await in between), 0.16-0.30 s when only the queue's dispatcher did."""
TOP_RANK = 1
"""The rank of ``prod`` in ``tiers: [dev, prod]``: what the first replica publishes while it waits."""


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with inference_server_process(SERVER) as url:
        yield url


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bp-burst") / "trace.jsonl"


@pytest.fixture(scope="module")
def pair(proxies: StartProxies, redis_server: RedisServer, server: str, trace_file: Path) -> list[LiteLLMProxy]:
    config: dict[str, Any] = {
        "model_list": [
            {
                "model_name": "burst",
                "litellm_params": {
                    "model": "openai/sim",
                    "api_base": server + "/v1",
                    "api_key": "sk-none",
                    "timeout": 60,
                },
                "model_info": {"id": "gpu-burst"},
            }
        ],
        "litellm_settings": {
            "callbacks": ["litellm_ratebalance.backpressure"],
            "ratebalance": {
                "key_prefix": PREFIX,
                "backpressure": {
                    "tiers": ["dev", "prod"],
                    "queue": {"enabled": True, "max_wait_seconds": 10},
                    "deployments": {
                        "gpu-burst": {"metrics_url": server + "/metrics", "kv_cache_tokens": SERVER.memory_tokens}
                    },
                },
            },
        },
        "router_settings": {"num_retries": 0},
    }
    return proxies(config, redis_url=redis_server.url, env={TRACE_ENV: str(trace_file)}, count=2)


def words(rng: random.Random, n: int) -> str:
    """``n`` three-letter words: the simulator (4 characters a token) and LiteLLM's counter count them alike."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def post(client: httpx.AsyncClient, token: str, content: str, max_tokens: int | None) -> httpx.Response:
    body: dict[str, Any] = {"model": "burst", "messages": [{"role": "user", "content": content}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"})


def test_burst_of_200_through_two_replicas(
    pair: list[LiteLLMProxy], server: str, trace_file: Path, redis_server: RedisServer
) -> None:
    rng = random.Random(3)
    first, second = pair

    async def run() -> tuple[list[httpx.Response], list[httpx.Response], dict[str, Any]]:
        a = first.async_client(timeout=httpx.Timeout(90.0))
        b = second.async_client(timeout=httpx.Timeout(90.0))
        try:
            burst = []
            for i in range(200):
                top = i % 5 == 0
                client = a if top or i % 2 else b
                content = words(rng, rng.randint(100, 600))
                burst.append(post(client, "sk-prod-1" if top else "sk-dev-1", content, (None, 300, 2048)[i % 3]))
            tasks = [asyncio.ensure_future(request) for request in burst]

            trickle = []
            for _ in range(40):  # lower-tier requests to the second replica every 0.1 s, without waiting
                await asyncio.sleep(0.1)
                trickle.append(asyncio.ensure_future(post(b, "sk-dev-2", words(rng, rng.randint(50, 200)), None)))
            late = list(await asyncio.gather(*trickle))
            answers = list(await asyncio.gather(*tasks))
            async with httpx.AsyncClient(timeout=10) as sim:
                stats = dict((await sim.get(server + "/_sim/stats")).json())
            return answers, late, stats
        finally:
            await a.aclose()
            await b.aclose()

    answers, late, stats = asyncio.run(run())
    everything = answers + late
    assert stats["oom_failures"] == 0, stats
    unexplained = [
        (r.status_code, r.text[:300])
        for r in everything
        if r.status_code != 200 and "x-litellm-backpressure-reason" not in r.headers
    ]
    assert not unexplained, unexplained
    # The top tier is served; the lower tier may be shed entirely when the machine is busy (the simulated
    # server then answers slower and its cache stays full), and each of its refusals is ours (above).
    top_served = sum(1 for i, r in enumerate(answers) if i % 5 == 0 and r.status_code == 200)
    assert top_served > 0, top_served

    events = [json.loads(line) for line in trace_file.read_text().splitlines() if line.strip()]
    events = [e for e in events if e.get("dep") == "gpu-burst"]
    pids = {e["pid"] for e in events}
    assert len(pids) == 2, pids
    # The first replica is the one the top tier's requests went to: the one that queued them.
    queued = [e for e in events if e["ev"] == "enqueue" and e["tier"] == "prod"]
    assert queued, "no top-tier request waited"
    waiting_pid = {e["pid"] for e in queued}
    assert len(waiting_pid) == 1, waiting_pid
    other = (pids - waiting_pid).pop()
    assert all(e["queue"] == 0 for e in events if e["pid"] == other), "the second replica queued a request"

    # The store held the top tier's wait from a publication's write (its ``t``) until the next publication
    # was sent (publications of one replica go one at a time), and at most the entry's time-to-live.
    publications = sorted((e for e in events if e["ev"] == "publish" and e["pid"] in waiting_pid), key=lambda e: e["t"])
    following = [*publications[1:], None]
    held = [
        (p["t"], min(p["t"] + WAITING_TTL_SECONDS, nxt["sent"] if nxt else math.inf))
        for p, nxt in zip(publications, following, strict=True)
        if TOP_RANK in p["ranks"]
    ]
    assert held, "the top tier's wait was never published"
    first_enqueue = min(e["t"] for e in queued)
    first_publication = min(p["sent"] for p in publications if TOP_RANK in p["ranks"])
    assert first_publication - first_enqueue <= PUBLISH_MARGIN_SECONDS, (first_enqueue, first_publication)

    # Lower-tier requests reached the second replica while the store held the wait: the check below has
    # something to hold back.
    during = [
        e
        for e in events
        if e["pid"] == other and e["ev"] == "route" and e["tier"] == "dev"
        for start, end in held
        if start <= e["t"] < end
    ]
    assert len(during) >= 10, len(during)
    slipped = [
        (e["sent"], e["t"], start, end)
        for e in events
        if e["pid"] == other and e["ev"] == "lease" and e["tier"] == "dev"
        for start, end in held
        if start <= e["sent"] < end
    ]
    assert not slipped, slipped

    # Afterwards the shared counts are exact: every lease given back once, no reserved token left, and no
    # replica still holding the lower tiers back (the empty queue was published, not left to lapse).
    leases, waiting = asyncio.run(shared_state_after(redis_server))
    assert leases == (0, 0), leases
    assert waiting == [], waiting
    last_publication = max(publications, key=lambda p: p["t"])
    assert last_publication["ranks"] == [], last_publication
    assert_no_store_errors(pair)
    for proxy in pair:
        assert "Traceback" not in proxy.log_text(), proxy.log_tail()


async def shared_state_after(redis_server: RedisServer) -> tuple[tuple[int, int], list[Any]]:
    """The deployment's (leases in flight, reserved tokens) once they reach zero (5 s at most: releases of the
    last answers may still be on their way), and the waiting entries still live in the store."""
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        store = RedisStore(client, KeySpace(PREFIX))
        snapshot = await store.concurrency_snapshot("gpu-burst")
        for _ in range(50):
            if (snapshot.inflight, snapshot.reserved_tokens) == (0, 0):
                break
            await asyncio.sleep(0.1)
            snapshot = await store.concurrency_snapshot("gpu-burst")
        now_ms = int(time.time() * 1000)
        live = await client.zrangebyscore(KeySpace(PREFIX).waiting_tiers("gpu-burst"), now_ms, "+inf")
        return (snapshot.inflight, snapshot.reserved_tokens), list(live)
    finally:
        await client.aclose()
