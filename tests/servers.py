"""Throwaway redis-server processes for the test session (loopback, free ports, no persistence).

Without ``redis-server`` on PATH (a laptop without root, a Mac), a test that needs a real server is skipped
with a reason starting :data:`NO_REDIS_SERVER` (tests/conftest.py sums them up in one line at the end, and
runs the store suites on fakeredis instead). CI sets :data:`REQUIRE_REDIS_SERVER_ENV`: there such a test
fails instead, so a CI machine that lost its redis-server cannot pass by skipping.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from litellm_ratebalance.demo.services import wait_until_redis_answers

__all__ = [
    "NO_REDIS_SERVER",
    "REQUIRE_REDIS_SERVER_ENV",
    "RedisServer",
    "free_port",
    "real_redis_required",
    "redis_server_binary",
    "skip_without_real_redis",
]

REQUIRE_REDIS_SERVER_ENV = "LITELLM_RATEBALANCE_REQUIRE_REDIS_SERVER"
"""Set to ``1`` (``make test`` and CI do): a test that needs a real redis-server fails when there is none, and
the store suites never fall back to fakeredis."""

NO_REDIS_SERVER = "no real Redis:"
"""Start of the skip reason of every test skipped for want of a real redis-server (tests/conftest.py counts
them by this prefix)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def real_redis_required() -> bool:
    """Whether this run forbids skipping (or faking) what needs a real redis-server (CI, ``make test``)."""
    return os.environ.get(REQUIRE_REDIS_SERVER_ENV, "") not in ("", "0")


def skip_without_real_redis(*binaries: str) -> None:
    """Return when every one of ``binaries`` (default ``redis-server``) is on PATH. Otherwise, inside a test
    (its setup, call or teardown), skip it with a reason starting :data:`NO_REDIS_SERVER`, or fail it when
    :func:`real_redis_required`; outside a test (a benchmark script), raise RuntimeError."""
    missing = [name for name in binaries or ("redis-server",) if shutil.which(name) is None]
    if not missing:
        return
    what = " and ".join(missing) + (" is" if len(missing) == 1 else " are") + " not on PATH"
    if os.environ.get("PYTEST_CURRENT_TEST") is None:  # (pytest sets it while a test runs)
        raise RuntimeError(f"{what} (make test installs redis-server with apt-get)")
    if real_redis_required():
        pytest.fail(f"{what}, and {REQUIRE_REDIS_SERVER_ENV}=1 forbids skipping this test", pytrace=False)
    pytest.skip(f"{NO_REDIS_SERVER} {what}")


class RedisServer:
    """One redis-server on 127.0.0.1; ``stop``/``start`` keep the port so clients can reconnect.

    Without ``redis-server`` on PATH, creating one skips the test (see :func:`skip_without_real_redis`)."""

    def __init__(self, port: int | None = None, extra_args: tuple[str, ...] = ()) -> None:
        skip_without_real_redis("redis-server")
        binary = redis_server_binary()
        assert binary is not None  # (checked just above)
        self.binary = binary
        self.port = port or free_port()
        self.extra_args = extra_args
        self.dir = Path(tempfile.mkdtemp(prefix="ratebalance-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_redis_answers(self.port, self.process)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
