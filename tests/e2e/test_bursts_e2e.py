"""Limits hold through bursts: hundreds of concurrent requests over two real proxy replicas sharing one
redis-server, with the default store settings, are decided exactly (see tests/e2e/bursts.py).

A proxy busy with a burst reads Redis's replies late (its event loop runs LiteLLM's per-request work for
every request of the burst); that lateness is not a Redis fault and must not make the limiter fail open.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.e2e.bursts import (
    RPM,
    RPM_MODELS,
    TPM,
    TPM_MODELS,
    assert_no_store_errors,
    burst_config,
    send_burst,
    window_counts,
)
from tests.e2e.conftest import StartProxies
from tests.e2e.harness import LiteLLMProxy
from tests.servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(scope="module")
def replicas(proxies: StartProxies, redis_server: RedisServer) -> list[LiteLLMProxy]:
    return proxies(burst_config(), redis_url=redis_server.url, count=2)


@pytest.fixture(scope="module")
def redis_sync(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    yield client
    client.close()


@pytest.mark.parametrize(("model", "count"), [(RPM_MODELS[0], 100), (RPM_MODELS[1], 300)])
async def test_rpm_burst_admits_exactly_the_limit(
    replicas: list[LiteLLMProxy], redis_sync: redis.Redis, model: str, count: int
) -> None:
    burst = await send_burst(replicas, model, count)

    assert burst.statuses == {200: RPM, 429: count - RPM}
    assert burst.uncounted == 0
    assert window_counts(redis_sync, model)[0] == RPM
    assert_no_store_errors(replicas)


@pytest.mark.parametrize(("model", "count"), [(TPM_MODELS[0], 60), (TPM_MODELS[1], 200)])
async def test_tpm_burst_serves_the_limit_without_overshoot(
    replicas: list[LiteLLMProxy], model: str, count: int
) -> None:
    burst = await send_burst(replicas, model, count, max_tokens=20)

    assert burst.uncounted == 0
    assert set(burst.statuses) == {200, 429}
    # Reservations are corrected to the real usage only after the answers: within a window nothing
    # admitted may take the served tokens past the tpm, and the limit is used, not left idle.
    assert 0.8 * TPM <= burst.served_tokens <= 1.02 * TPM, burst
    assert_no_store_errors(replicas)
