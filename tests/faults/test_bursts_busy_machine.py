"""The burst tests of tests/e2e/test_bursts_e2e.py on a busy machine: two processes burn a CPU each while two
real proxy replicas (one shared redis-server, default store settings) decide bursts at an rpm and a tpm limit.

Every proxy, the load, Redis and the two burners share this machine's cores, so each proxy's event loop is
late far more often than on a quiet machine; the limits must still hold exactly and no store call may count
as a fault (Redis itself answers in time).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.bursts import (
    RPM,
    RPM_MODELS,
    TPM,
    TPM_MODELS,
    assert_no_store_errors,
    burst_config,
    cpu_hogs,
    send_burst,
)
from tests.e2e.conftest import StartProxies
from tests.e2e.harness import LiteLLMProxy
from tests.servers import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def replicas(proxies: StartProxies, own_redis: RedisServer) -> list[LiteLLMProxy]:
    return proxies(burst_config(), redis_url=own_redis.url, count=2)


@pytest.mark.parametrize(("model", "count"), [(RPM_MODELS[2], 100), (RPM_MODELS[3], 300)])
async def test_rpm_burst_on_a_busy_machine_admits_exactly_the_limit(
    replicas: list[LiteLLMProxy], model: str, count: int
) -> None:
    with cpu_hogs(2):
        burst = await send_burst(replicas, model, count)

    assert burst.statuses == {200: RPM, 429: count - RPM}
    assert burst.uncounted == 0
    assert_no_store_errors(replicas)


async def test_tpm_burst_on_a_busy_machine_serves_the_limit_without_overshoot(replicas: list[LiteLLMProxy]) -> None:
    with cpu_hogs(2):
        burst = await send_burst(replicas, TPM_MODELS[2], 60, max_tokens=20)

    assert burst.uncounted == 0
    assert 0.8 * TPM <= burst.served_tokens <= 1.02 * TPM, burst
    assert_no_store_errors(replicas)
