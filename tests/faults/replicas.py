"""The proxies of a fault test: their configs and the body of the module fixtures that start them.

Each fault test runs two replicas of one model group twice: with our limiter (``litellm_ratebalance.rate_limiter``,
:func:`ratebalance_config`, started by :func:`running`) and with LiteLLM's own ``parallel_request_limiter_v3``
(:func:`litellm_limiter_config`, started by :func:`running_litellm_limiter`: every key has ``rpm_limit``, from
tests/faults/limit_auth.py, and windows of ``LITELLM_RATE_LIMIT_WINDOW_SIZE``). They reach Redis as the fault
needs: ``litellm_settings.cache_params`` (:func:`redis_cache`, :func:`sentinel_cache`, :func:`cluster_cache`;
response caching left off with ``mode: default_off``) or, for our store alone, ``redis_url``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import LiteLLMProxy, litellm_binary, start_all, stop_all
from tests.faults.support import Load

__all__ = [
    "FAIL_MODES",
    "LIMIT_AUTH",
    "OPEN_AND_CLOSED",
    "cluster_cache",
    "litellm_limiter_config",
    "ratebalance_config",
    "redis_cache",
    "running",
    "running_fail_modes",
    "running_litellm_limiter",
    "sentinel_cache",
]

LIMIT_AUTH = Path(__file__).with_name("limit_auth.py")
"""``general_settings.custom_auth`` of the LiteLLM-limiter replicas, copied next to their config.yaml."""
FAIL_MODES = ("open", "closed")
"""Our limiter's replicas in a fail-mode test: one of each ``fail_mode``, named after it."""
OPEN_AND_CLOSED: tuple[tuple[str, bool], ...] = (("litellm-open", False), ("litellm-closed", True))
"""LiteLLM's limiter in a fail-mode test: ``(name, fail_closed_rate_limit_enforcement)`` of each replica."""


def redis_cache(port: int) -> dict[str, Any]:
    """``cache_params`` for one redis-server on loopback."""
    return {"type": "redis", "host": "127.0.0.1", "port": port, "mode": "default_off"}


def sentinel_cache(sentinel_nodes: list[list[str | int]], service: str) -> dict[str, Any]:
    """``cache_params`` for a Sentinel-managed master."""
    return {"type": "redis", "mode": "default_off", "sentinel_nodes": sentinel_nodes, "service_name": service}


def cluster_cache(startup_nodes: Iterable[tuple[str, int]]) -> dict[str, Any]:
    """``cache_params`` for a Redis Cluster."""
    nodes = [{"host": host, "port": port} for host, port in startup_nodes]
    return {"type": "redis", "mode": "default_off", "redis_startup_nodes": nodes}


def ratebalance_config(
    load: Load,
    deployment: dict[str, Any],
    *,
    timeout_s: float,
    fail_mode: str | None = None,
    retry_after_s: float | None = None,
    fault_log_interval_s: float | None = None,
    cache_params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A proxy config with our limiter on ``deployment``'s model group, with ``load``'s key prefix and window;
    the ``ratebalance`` settings left ``None`` are left out (their defaults apply). ``cache_params`` (with
    ``cache: true``) is where the store finds Redis when no ``redis_url`` is given."""
    settings: dict[str, Any] = {"key_prefix": load.prefix}
    if fail_mode is not None:
        settings["fail_mode"] = fail_mode
    settings["store_timeout_seconds"] = timeout_s
    if retry_after_s is not None:
        settings["store_retry_after_seconds"] = retry_after_s
    if fault_log_interval_s is not None:
        settings["fault_log_interval_seconds"] = fault_log_interval_s
    settings["limiter"] = {"window_seconds": load.window_s}
    litellm_settings: dict[str, Any] = {"callbacks": ["litellm_ratebalance.rate_limiter"]}
    if cache_params is not None:
        litellm_settings["cache"] = True
        litellm_settings["cache_params"] = cache_params
    litellm_settings["ratebalance"] = settings
    return {"model_list": [deployment], "litellm_settings": litellm_settings, "router_settings": {"num_retries": 0}}


def litellm_limiter_config(
    deployment: dict[str, Any], cache_params: dict[str, Any], *, fail_closed: bool = False
) -> dict[str, Any]:
    """A proxy config without our limiter: LiteLLM's own enforces each key's ``rpm_limit`` through the Redis of
    ``cache_params``; ``fail_closed`` sets ``fail_closed_rate_limit_enforcement``."""
    general: dict[str, Any] = {"custom_auth": "limit_auth.user_api_key_auth"}
    if fail_closed:
        general["fail_closed_rate_limit_enforcement"] = True
    return {
        "model_list": [deployment],
        "litellm_settings": {"cache": True, "cache_params": cache_params},
        "general_settings": general,
        "router_settings": {"num_retries": 0},
    }


@contextmanager
def running(
    named_configs: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    redis_url: str | None = None,
    env: Mapping[str, str] | None = None,
    files: Sequence[Path] = (),
) -> Iterator[list[LiteLLMProxy]]:
    """The body of a module fixture: skip without the litellm executable, else start a proxy per
    ``(name, config)`` at once (``files`` copied next to each config.yaml first) and stop them all at the end."""
    if litellm_binary() is None:
        pytest.skip("the litellm proxy executable is not installed (pip install 'litellm[proxy]')")
    pair = [LiteLLMProxy(config, redis_url=redis_url, env=env, name=name) for name, config in named_configs]
    for proxy in pair:
        for path in files:
            shutil.copyfile(path, proxy.workdir / path.name)
    try:
        yield start_all(pair)
    finally:
        stop_all(pair)


def running_fail_modes(
    config: Callable[[str], Mapping[str, Any]], *, redis_url: str | None = None
) -> AbstractContextManager[list[LiteLLMProxy]]:
    """:func:`running` for ``[open, closed]``: one replica per fail mode, ``config(fail_mode)``."""
    return running(((mode, config(mode)) for mode in FAIL_MODES), redis_url=redis_url)


def running_litellm_limiter(
    deployment: dict[str, Any],
    cache_params: dict[str, Any],
    replicas: Iterable[tuple[str, bool]],
    *,
    window_s: int,
    rpm: int,
) -> AbstractContextManager[list[LiteLLMProxy]]:
    """:func:`running` for LiteLLM's own limiter: a replica per ``(name, fail_closed)``, every key limited to
    ``rpm`` per ``window_s`` window."""
    env = {"LITELLM_RATE_LIMIT_WINDOW_SIZE": str(window_s), "RATEBALANCE_FAULTS_RPM_LIMIT": str(rpm)}
    configs = (
        (name, litellm_limiter_config(deployment, cache_params, fail_closed=closed)) for name, closed in replicas
    )
    return running(configs, env=env, files=(LIMIT_AUTH,))
