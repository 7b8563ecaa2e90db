"""The proxy's own Redis client as the store asks for it: LiteLLM's, re-read at most once per interval."""

from __future__ import annotations

import asyncio
from typing import Any

from litellm_ratebalance.proxy.runtime import LiteLLMRedisClient


class FakeCache:
    """A LiteLLM ``RedisCache`` stand-in whose every ``init_async_client`` returns a new client."""

    def __init__(self) -> None:
        self.asked = 0

    def init_async_client(self) -> Any:
        self.asked += 1
        return object()


async def test_the_client_is_asked_for_once_per_interval() -> None:
    cache, now = FakeCache(), [100.0]
    client_of = LiteLLMRedisClient(cache, refresh_seconds=1.0, clock=lambda: now[0])
    first = client_of()
    now[0] += 0.5
    assert client_of() is first and cache.asked == 1
    now[0] += 0.5  # the interval is over: LiteLLM may have replaced its client
    second = client_of()
    assert second is not first and cache.asked == 2
    assert client_of() is second


def test_another_event_loop_asks_again() -> None:
    """LiteLLM keeps one client per event loop: one of another loop must never be reused."""
    cache = FakeCache()
    client_of = LiteLLMRedisClient(cache, refresh_seconds=60.0, clock=lambda: 0.0)

    async def get() -> Any:
        return client_of()

    first = asyncio.run(get())
    second = asyncio.run(get())
    assert second is not first and cache.asked == 2
