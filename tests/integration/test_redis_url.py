"""``ratebalance.redis_url`` and the proxy's discovered Redis: passwords, database numbers, TLS; and
credentials never appear in a log line, an error or a configuration message.

Each test starts a throwaway redis-server of its own on a free loopback port (``--requirepass``, a TLS port
with a self-signed certificate made by ``openssl``), so the session server stays untouched.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi import HTTPException

from litellm_ratebalance.errors import ConfigurationError, StoreError
from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.admission import PriorityRateLimiter
from litellm_ratebalance.proxy.runtime import Runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.store import KeySpace, RedisStore
from tests.integration.limiter_support import auth, make_router, request
from tests.servers import RedisServer, free_port

pytestmark = pytest.mark.redis

PASSWORD = "s3cret-Pa55word-7f3e"
"""Distinctive, so a leak anywhere in a message or a log is found by a plain substring search."""
PREFIX = "rburl"


def require_password(server: RedisServer) -> None:
    """Turn on ``requirepass`` once the server runs (tests/servers.py checks start-up with a plain PING,
    which a protected server would refuse)."""
    client = redis.Redis(port=server.port, socket_timeout=2)
    try:
        client.config_set("requirepass", PASSWORD)
    finally:
        client.close()


@pytest.fixture
def protected() -> Iterator[RedisServer]:
    with RedisServer() as server:
        require_password(server)
        yield server


def url_of(server: RedisServer, *, password: str = PASSWORD, db: int = 0, scheme: str = "redis", port: int = 0) -> str:
    return f"{scheme}://:{password}@127.0.0.1:{port or server.port}/{db}"


def limiter_for(url: str, *, fail_mode: str = "open", rpm: int = 3) -> PriorityRateLimiter:
    settings = parse_settings(
        {
            "ratebalance": {
                "redis_url": url,
                "key_prefix": PREFIX,
                "fail_mode": fail_mode,
                "store_retry_after_seconds": 0.0,
                "fault_log_interval_seconds": 0.0,  # log every fault: each one is checked for leaks
                # Ample for a first connection on a loaded machine: these tests are about URLs and
                # passwords, and a timeout (seen once at the default 0.5 s in CI) would hide what failed.
            }
        }
    )
    runtime = Runtime()
    runtime.configure(settings=settings, router=make_router(rpm=rpm))
    return PriorityRateLimiter(runtime)


async def decide(limiter: PriorityRateLimiter) -> int | HTTPException:
    try:
        await limiter.async_pre_call_hook(auth(), None, request(), "acompletion")
    except HTTPException as exc:
        return exc
    return 200


def keys_in(server: RedisServer, db: int) -> list[bytes]:
    client = redis.Redis(port=server.port, password=PASSWORD, db=db, socket_timeout=2)
    try:
        return list(client.scan_iter(match=f"{PREFIX}:*"))
    finally:
        client.close()


# -- passwords and database numbers -------------------------------------------------------------------------
async def test_password_and_db_number_in_the_url_are_used(
    protected: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = limiter_for(url_of(protected, db=3))
    with caplog.at_level(logging.DEBUG, logger="litellm_ratebalance"):
        outcomes = [await decide(limiter) for _ in range(4)]
    assert outcomes[:3] == [200] * 3
    assert isinstance(outcomes[3], HTTPException) and outcomes[3].status_code == 429  # counted: rpm 3 holds
    assert keys_in(protected, 3) == [KeySpace(PREFIX).admission_window("m").encode()]
    assert keys_in(protected, 0) == []  # nothing in the default database
    assert "using the Redis at ratebalance.redis_url redis://***@127.0.0.1" in caplog.text
    assert PASSWORD not in caplog.text
    await limiter._runtime().store().aclose()


async def test_a_wrong_password_fails_open_without_showing_it(
    protected: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "wr0ng-Pa55word-c41d"
    limiter = limiter_for(url_of(protected, password=wrong), fail_mode="open")
    store = limiter._runtime().store()
    assert isinstance(store, RedisStore)
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(StoreError) as raised:
            await store.ping()
        assert [await decide(limiter) for _ in range(3)] == [200] * 3  # fail open: served uncounted
    message = str(raised.value)
    assert "AuthenticationError" in message or "ResponseError" in message  # says what went wrong ...
    assert wrong not in message and PASSWORD not in message  # ... but not the secret
    assert wrong not in repr(raised.value.__cause__)
    assert "store error, failing open" in caplog.text
    assert wrong not in caplog.text and PASSWORD not in caplog.text
    await store.aclose()


async def test_a_wrong_password_fail_closed_answers_503_without_showing_it(protected: RedisServer) -> None:
    wrong = "wr0ng-Pa55word-9a0b"
    limiter = limiter_for(url_of(protected, password=wrong), fail_mode="closed")
    outcome = await decide(limiter)
    assert isinstance(outcome, HTTPException) and outcome.status_code == 503
    assert wrong not in str(outcome.detail) and wrong not in str(outcome.headers)
    await limiter._runtime().store().aclose()


async def test_a_down_redis_error_names_no_credentials(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://admin:{PASSWORD}@127.0.0.1:{free_port()}/2"  # nothing listens there
    limiter = limiter_for(url)
    with caplog.at_level(logging.DEBUG):
        assert await decide(limiter) == 200
        with pytest.raises(StoreError) as raised:
            await limiter._runtime().store().ping()
    assert "ConnectionError" in str(raised.value)
    assert PASSWORD not in str(raised.value) and PASSWORD not in caplog.text and "admin:" not in caplog.text


# -- settings -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "says"),
    [
        (f"http://:{PASSWORD}@127.0.0.1:6379/0", "unsupported scheme 'http'"),
        (f"redis://:{PASSWORD}@127.0.0.1:6379/zero", "database number must be a non-negative integer"),
        (f"redis://:{PASSWORD}@127.0.0.1:notaport/0", "not a valid URL"),
        (f"redis://:{PASSWORD}@/0", "no host"),
    ],
)
def test_a_bad_url_is_refused_with_the_key_path_and_no_password(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_settings({"ratebalance": {"redis_url": url}})
    message = str(raised.value)
    assert "litellm_settings.ratebalance.redis_url: " in message and says in message
    assert "redis://" in message and "rediss://" in message  # names what is valid
    assert PASSWORD not in message and "***@" in message


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379",
        f"redis://user:{PASSWORD}@127.0.0.1:6379/15",
        "rediss://127.0.0.1:6380/1?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.pem",
        "unix:///run/redis.sock?db=2",
    ],
)
def test_good_urls_are_accepted(url: str) -> None:
    assert parse_settings({"ratebalance": {"redis_url": url}}).ratebalance.redis_url == url


def test_an_empty_url_means_unset() -> None:
    assert parse_settings({"ratebalance": {"redis_url": ""}}).ratebalance.redis_url is None


# -- TLS --------------------------------------------------------------------------------------------------------
@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[RedisServer, int, Path]]:
    """A password-protected redis-server with a TLS port (self-signed certificate for 127.0.0.1)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    tls_port = free_port()
    args = (
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert),
        "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
    )  # fmt: skip
    try:
        server = RedisServer(extra_args=args)
        server.start()
        require_password(server)
    except RuntimeError as exc:  # a redis-server built without TLS refuses --tls-port
        pytest.skip(f"redis-server cannot serve TLS here: {exc}")
    try:
        yield server, tls_port, cert
    finally:
        server.stop()


async def test_rediss_url_with_tls_options_verifies_and_counts(tls_server: tuple[RedisServer, int, Path]) -> None:
    server, tls_port, cert = tls_server
    url = f"{url_of(server, scheme='rediss', port=tls_port, db=4)}?ssl_cert_reqs=required&ssl_ca_certs={cert}"
    limiter = limiter_for(url)
    outcomes = [await decide(limiter) for _ in range(4)]
    assert outcomes[:3] == [200] * 3 and isinstance(outcomes[3], HTTPException)
    assert keys_in(server, 4) == [KeySpace(PREFIX).admission_window("m").encode()]
    await limiter._runtime().store().aclose()


async def test_rediss_without_the_ca_fails_verification_and_fails_open(
    tls_server: tuple[RedisServer, int, Path], caplog: pytest.LogCaptureFixture
) -> None:
    server, tls_port, _ = tls_server
    url = f"{url_of(server, scheme='rediss', port=tls_port)}?ssl_cert_reqs=required"  # self-signed: not trusted
    limiter = limiter_for(url)
    with caplog.at_level(logging.WARNING, logger="litellm_ratebalance"):
        assert await decide(limiter) == 200
    assert "store error, failing open" in caplog.text and PASSWORD not in caplog.text
    assert keys_in(server, 0) == []
    await limiter._runtime().store().aclose()


# -- the proxy's own Redis (LiteLLM's RedisCache), discovered -----------------------------------------------------
async def test_discovered_litellm_redis_keeps_its_password_and_db(
    protected: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from litellm.caching.redis_cache import RedisCache

    cache: Any = RedisCache(host="127.0.0.1", port=protected.port, password=PASSWORD, db=5)
    monkeypatch.setattr(_litellm, "discover_redis_cache", lambda: cache)
    runtime = Runtime()
    runtime.configure(settings=parse_settings({"ratebalance": {"key_prefix": PREFIX}}), router=make_router(rpm=2))
    limiter = PriorityRateLimiter(runtime)
    outcomes = [await decide(limiter) for _ in range(3)]
    assert outcomes[:2] == [200, 200] and isinstance(outcomes[2], HTTPException)
    store = runtime.store()
    assert isinstance(store, RedisStore) and store.backend == "redis"
    assert keys_in(protected, 5) == [KeySpace(PREFIX).admission_window("m").encode()]
