"""Fixtures for end-to-end tests that run the real ``litellm`` proxy (see tests/e2e/harness.py).

``proxies`` (module-scoped) starts proxies for one test module and stops them all when the module is
done, so each module pays the start-up cost once::

    @pytest.fixture(scope="module")
    def pair(proxies, redis_server):
        return proxies(CONFIG, redis_url=redis_server.url, count=2)   # two replicas, one Redis

Mark e2e modules with ``pytestmark = pytest.mark.e2e``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from tests.e2e.harness import LiteLLMProxy, litellm_binary, start_all, stop_all

StartProxies = Callable[..., list[LiteLLMProxy]]


@pytest.fixture(scope="module")
def proxies() -> Iterator[StartProxies]:
    """``proxies(config, *, redis_url=None, keys=None, env=None, count=1) -> [LiteLLMProxy, ...]``.

    ``count`` > 1 starts that many replicas of the same config at once (share state through
    ``redis_url``). Everything started is stopped at the end of the module.
    """
    if litellm_binary() is None:
        pytest.skip("the litellm proxy executable is not installed (pip install 'litellm[proxy]')")
    started: list[LiteLLMProxy] = []

    def start(
        config: Mapping[str, Any],
        *,
        redis_url: str | None = None,
        keys: Mapping[str, Mapping[str, Any]] | None = None,
        env: Mapping[str, str] | None = None,
        count: int = 1,
    ) -> list[LiteLLMProxy]:
        group = [
            LiteLLMProxy(config, redis_url=redis_url, keys=keys, env=env, name=f"proxy{len(started) + i}")
            for i in range(count)
        ]
        started.extend(group)
        return start_all(group)

    try:
        yield start
    finally:
        stop_all(started)
