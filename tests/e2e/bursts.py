"""Concurrent bursts at an rpm and a tpm limit through two real proxy replicas sharing one redis-server,
with the store settings users get by default (no ``store_timeout_seconds`` or breaker tuning).

Shared by tests/e2e/test_bursts_e2e.py (a quiet machine) and tests/faults/test_bursts_busy_machine.py (the
same bursts with CPU-burning processes beside the proxies). Each burst goes to a model group of its own, so
it starts a fresh limiter window and its counts are read exactly from that window afterwards.

A burst proves the limiter decided every request through Redis: an admission decided in the store carries
``x-litellm-saturation`` (one admitted fail-open has none), and the proxies' logs hold no store error.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from litellm_ratebalance.store.keys import KeySpace
from tests.e2e.harness import LiteLLMProxy, chat_body, mock_deployment

__all__ = [
    "PREFIX",
    "RPM",
    "TPM",
    "Burst",
    "assert_no_store_errors",
    "burst_config",
    "cpu_hogs",
    "send_burst",
]

PREFIX = "e2e-bursts"
RPM = 30
TPM = 600
RPM_MODELS = tuple(f"rpm-{i}" for i in range(8))
"""One model group per rpm burst: each burst opens a window of its own."""
TPM_MODELS = tuple(f"tpm-{i}" for i in range(4))
PROMPT = "Say hello."
"""Counted as 10 prompt tokens by LiteLLM's token counter, as many as LiteLLM's ``mock_response`` reports (it
always reports 10 prompt + 20 completion tokens): the limiter's count then matches the usage served, as it does
against a provider whose prompt count agrees with LiteLLM's."""
UPSTREAM_DELAY_S = 0.5
"""The mock answer's delay: the whole burst is in flight at once, as against a real provider."""


def burst_config() -> dict[str, Any]:
    """The limiter as the only callback, default store settings; rpm and tpm model groups."""
    models = [mock_deployment(name, rpm=RPM, mock_delay=UPSTREAM_DELAY_S) for name in RPM_MODELS]
    models += [mock_deployment(name, tpm=TPM, mock_delay=UPSTREAM_DELAY_S) for name in TPM_MODELS]
    return {
        "model_list": models,
        "litellm_settings": {
            "callbacks": ["litellm_ratebalance.rate_limiter"],
            "ratebalance": {"key_prefix": PREFIX},
        },
        "router_settings": {"num_retries": 0},
    }


@dataclass(frozen=True, slots=True)
class Burst:
    """What the clients of one burst saw."""

    statuses: Counter[int]
    uncounted: int
    """Requests served (200) without ``x-litellm-saturation``: admitted without the store."""
    served_tokens: int
    """Total tokens of the served answers, as their ``usage`` reports them."""


async def send_burst(replicas: list[LiteLLMProxy], model: str, count: int, *, max_tokens: int | None = None) -> Burst:
    """``count`` requests at once, alternating between the replicas."""
    clients = [replica.async_client() for replica in replicas]
    try:
        body = chat_body(model, PROMPT, max_tokens=max_tokens)
        responses = await asyncio.gather(
            *(
                clients[i % len(replicas)].post(
                    "/v1/chat/completions", headers=replicas[i % len(replicas)].auth("sk-none"), json=body
                )
                for i in range(count)
            )
        )
    finally:
        for client in clients:
            await client.aclose()
    served = [response for response in responses if response.status_code == 200]
    return Burst(
        statuses=Counter(response.status_code for response in responses),
        uncounted=sum(1 for response in served if "x-litellm-saturation" not in response.headers),
        served_tokens=sum(int(response.json()["usage"]["total_tokens"]) for response in served),
    )


def window_counts(client: redis.Redis, model: str) -> tuple[int, int]:
    """(requests, tokens) of the model group's current limiter window in Redis."""
    raw: dict[bytes, bytes] = client.hgetall(KeySpace(PREFIX).admission_window(model))  # type: ignore[assignment]
    return int(raw.get(b"r", 0)), int(raw.get(b"t", 0))


def assert_no_store_errors(replicas: list[LiteLLMProxy]) -> None:
    """No replica logged a store fault (every store call of the bursts answered in time)."""
    for replica in replicas:
        log = replica.log_text()
        assert "store error" not in log, f"{replica.name}: {replica.log_tail(20)}"


@contextlib.contextmanager
def cpu_hogs(count: int = 2, max_seconds: float = 600.0) -> Iterator[None]:
    """``count`` processes that burn a CPU each (a busy machine) while the block runs; each stops by itself
    after ``max_seconds`` at the latest."""
    burn = f"import time\nend = time.monotonic() + {max_seconds}\nwhile time.monotonic() < end: pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
