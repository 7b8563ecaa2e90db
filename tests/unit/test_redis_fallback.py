"""The test session on a machine without ``redis-server``: the store suite runs on fakeredis (our Lua scripts
included), a test that needs the real server is skipped and named in one summary line, and under
``LITELLM_RATEBALANCE_REQUIRE_REDIS_SERVER=1`` (``make test``, CI) the same run fails instead.

Each case runs pytest in a child process whose PATH is an empty directory (so no ``redis-server`` or
``redis-cli``), on three tests: one of a store suite (a burst on ``concurrency_acquire.lua``, on each
backend), one needing a real server through the ``redis_server`` fixture and one starting its own
:class:`~tests.servers.RedisServer`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.servers import REQUIRE_REDIS_SERVER_ENV

ROOT = Path(__file__).resolve().parents[2]
SELECTION = (
    "tests/store/test_concurrency_store.py::test_concurrent_acquires_take_exactly_the_cap",
    "tests/integration/test_redis_operations.py::test_noeviction_is_quiet",
    "tests/integration/test_redis_operations.py::test_evicting_policy_is_warned_about",
)
SUMMARY = "redis-server is not on PATH:"


def _pytest_without_redis_server(tmp_path: Path, *, require: bool) -> subprocess.CompletedProcess[str]:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (REQUIRE_REDIS_SERVER_ENV, "PYTEST_ADDOPTS")}
    env.update(PATH=str(empty), LITELLM_LOCAL_MODEL_COST_MAP="True")
    if require:
        env[REQUIRE_REDIS_SERVER_ENV] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-W", "ignore", *SELECTION],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )


def test_without_redis_server_the_store_suite_runs_on_fakeredis_and_one_line_names_the_skips(tmp_path: Path) -> None:
    done = _pytest_without_redis_server(tmp_path, require=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert re.search(r"test_concurrent_acquires_take_exactly_the_cap\[fakeredis\] PASSED", out), out
    assert re.search(r"test_concurrent_acquires_take_exactly_the_cap\[memory\] PASSED", out), out
    assert "[redis]" not in out
    summary = [line for line in out.splitlines() if SUMMARY in line]
    assert summary == [
        "redis-server is not on PATH: the store suites ran on fakeredis; skipped 2 tests that need a real server: "
        "tests/integration/test_redis_operations.py (2) (install redis-server to run them; CI runs them all)"
    ], out


def test_where_a_real_server_is_required_its_absence_fails_the_run(tmp_path: Path) -> None:
    done = _pytest_without_redis_server(tmp_path, require=True)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "[fakeredis]" not in out and SUMMARY not in out and "SKIPPED" not in out
    # The store suite's Redis leg and both real-server tests error out; the memory leg still passes.
    assert re.search(r"test_concurrent_acquires_take_exactly_the_cap\[memory\] PASSED", out), out
    assert re.search(r"test_concurrent_acquires_take_exactly_the_cap\[redis\] ERROR", out), out
    assert re.search(r"test_noeviction_is_quiet ERROR", out), out
    assert re.search(r"test_evicting_policy_is_warned_about FAILED", out), out
    assert f"{REQUIRE_REDIS_SERVER_ENV}=1 forbids skipping" in out
