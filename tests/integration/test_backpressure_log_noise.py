"""Backpressure's log lines: refusals reported by LiteLLM become one WARNING per reason per interval without a
traceback, and a metrics endpoint is reported only once it failed twice in a row.

The real proxy's output is checked in tests/e2e/test_backpressure_logs_e2e.py; here the rules, with a fake
clock and a fake fetcher.
"""

from __future__ import annotations

import logging

import httpx
import pytest

from litellm_ratebalance.overload.signals import SCRAPE_FAILURES_BEFORE_WARNING, SignalBoard
from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.backpressure.refusals import (
    LITELLM_LOGGERS,
    MARK,
    REFUSAL_LOG,
    RefusalLogFilter,
    quiet_refusal_logs,
)

OURS = "litellm_ratebalance.backpressure"
VLLM = (
    "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.1\n"
    'vllm:cache_config_info{block_size="16",num_gpu_blocks="2048"} 1\n'
)
"""A vLLM body with every signal (the capacity included): only the endpoint's failures can be reported."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refusal(reason: str, status: int = 503) -> Exception:
    message = f"litellm_ratebalance backpressure ({reason}): model group 'm', deployment 'gpu1': full"
    exc = _litellm.service_unavailable(message, {"retry-after": "1"})
    if status == 429:
        exc = _litellm.rate_limit_exception(message, {"retry-after": "1"}, "m")
    setattr(exc, MARK, reason)
    return exc


def report(log: logging.Logger, exc: Exception, *, traceback: bool) -> None:
    """Log ``exc`` as LiteLLM's proxy does: ``exception`` (traceback) for a 5xx, ``error`` for a 4xx."""
    try:
        raise exc
    except Exception as raised:
        method = log.exception if traceback else log.error
        method("_handle_llm_api_exception(): Exception occured - litellm_call_id=%s - %s", "call-1", raised)


@pytest.fixture
def litellm_log(caplog: pytest.LogCaptureFixture) -> logging.Logger:
    log = logging.getLogger("tests.litellm_ratebalance.fake_litellm_proxy")
    caplog.set_level(logging.DEBUG)
    return log


def test_a_refusal_is_one_warning_per_reason_per_interval_without_traceback(
    litellm_log: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    quiet = RefusalLogFilter(30.0, clock)
    litellm_log.addFilter(quiet)
    try:
        for _ in range(5):
            report(litellm_log, refusal("memory_pressure"), traceback=True)
        report(litellm_log, refusal("concurrency_limit", 429), traceback=False)
        clock.now += 29.9
        report(litellm_log, refusal("memory_pressure"), traceback=True)
        clock.now += 0.1
        report(litellm_log, refusal("memory_pressure"), traceback=True)
        litellm_log.error("an upstream failed", exc_info=ValueError("not ours"))
    finally:
        litellm_log.removeFilter(quiet)

    theirs = [r for r in caplog.records if r.name == litellm_log.name]
    ours = [r for r in caplog.records if r.name == OURS]
    # LiteLLM's records of our refusals are gone; its record of another failure is kept as it was.
    assert [(r.levelno, r.getMessage()) for r in theirs] == [(logging.ERROR, "an upstream failed")]
    assert [r.levelno for r in ours] == [logging.WARNING] * 3
    assert all(r.exc_info is None for r in ours)
    messages = [r.getMessage() for r in ours]
    assert messages[0].startswith("litellm_ratebalance backpressure (memory_pressure): model group 'm'")
    assert "[answered 503;" in messages[0] and ": 0 more of this reason since the last warning" in messages[0]
    assert messages[1].startswith("litellm_ratebalance backpressure (concurrency_limit)")
    assert "[answered 429;" in messages[1]
    # The interval has passed: the 4 refusals after the first and the one just inside the interval are counted.
    assert messages[2].startswith("litellm_ratebalance backpressure (memory_pressure)")
    assert ": 5 more of this reason since the last warning" in messages[2]


def test_the_filter_sits_on_litellms_proxy_and_router_loggers() -> None:
    from litellm._logging import verbose_proxy_logger, verbose_router_logger

    # The names are LiteLLM's; if they change, refusals are logged with tracebacks again.
    assert {verbose_proxy_logger.name, verbose_router_logger.name} == set(LITELLM_LOGGERS)
    quiet_refusal_logs()
    quiet_refusal_logs()
    for log in (verbose_proxy_logger, verbose_router_logger):
        assert log.filters.count(REFUSAL_LOG) == 1


async def test_one_failed_scrape_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    """The first scrape times out (the loop was busy) though the server is up; the next one succeeds."""
    answers: list[str | Exception] = [httpx.ConnectTimeout("timed out"), VLLM, VLLM]

    async def fetch(url: str, timeout: float) -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    board = SignalBoard(fetch)
    with caplog.at_level(logging.INFO, logger=OURS):
        assert await board.scrape("gpu1", "http://gpu1:8000/metrics", "vllm", 0.5, now=0.0) is None
        assert board.is_failing("gpu1")
        assert await board.scrape("gpu1", "http://gpu1:8000/metrics", "vllm", 0.5, now=1.0) is not None
        assert not board.is_failing("gpu1")
        assert board.metrics("gpu1", 1.5, stale_after=10.0) is not None
    assert [r.getMessage() for r in caplog.records if r.name == OURS] == []


async def test_failures_in_a_row_are_reported_once_and_the_recovery_once(caplog: pytest.LogCaptureFixture) -> None:
    assert SCRAPE_FAILURES_BEFORE_WARNING == 2
    down = {"value": True}

    async def fetch(url: str, timeout: float) -> str:
        if down["value"]:
            raise httpx.ConnectError("connection refused")
        return VLLM

    board = SignalBoard(fetch)
    with caplog.at_level(logging.INFO, logger=OURS):
        for t in range(4):
            assert await board.scrape("gpu1", "http://gpu1:8000/metrics", "vllm", 0.5, now=float(t)) is None
        down["value"] = False
        assert await board.scrape("gpu1", "http://gpu1:8000/metrics", "vllm", 0.5, now=4.0) is not None
    messages = [r.getMessage() for r in caplog.records if r.name == OURS]
    assert len(messages) == 2, messages
    assert (
        "cannot scrape http://gpu1:8000/metrics for deployment gpu1 (2 attempts in a row, the last ConnectError"
        in (messages[0])
    )
    assert (
        messages[1]
        == "litellm_ratebalance backpressure: metrics of deployment gpu1 are back (http://gpu1:8000/metrics)"
    )
