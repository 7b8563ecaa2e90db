"""Loading of the packaged Lua scripts and running them with NOSCRIPT recovery.

Each ``lua/<name>.lua`` file is one atomic operation and opens with a comment stating its KEYS, ARGV
(with units), return value and clock (always Redis ``TIME``). Scripts are registered with redis-py's
``register_script``, whose ``AsyncScript`` sends EVALSHA and reloads the script on NOSCRIPT (after a
``SCRIPT FLUSH`` or a Redis restart); we never hand-roll EVALSHA.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from redis.exceptions import RedisError

from litellm_ratebalance.errors import StoreError

__all__ = ["ScriptRunner", "load_lua"]


@cache
def load_lua(name: str) -> str:
    """Return the source of the packaged script ``lua/<name>.lua``."""
    return resources.files("litellm_ratebalance.store").joinpath("lua", f"{name}.lua").read_text("utf-8")


class ScriptRunner:
    """Runs packaged scripts on one ``redis.asyncio`` client (plain or cluster).

    Redis failures become :class:`StoreError` with the redis-py error as ``__cause__``; the message never
    contains the connection URL (it may hold a password).
    """

    __slots__ = ("_broken_until", "_client", "_cooldown", "_scripts", "_timeout")

    def __init__(
        self, client: Any | Callable[[], Any], *, timeout_seconds: float = 0.5, cooldown_seconds: float = 1.0
    ) -> None:
        """``timeout_seconds`` bounds one script call (connect, retries and reply included);
        ``cooldown_seconds``: after a failure, calls fail at once for that long instead of each waiting for
        Redis again (a circuit breaker: a down Redis must not add its timeout to every request)."""
        # A callable is asked for the client at each call: LiteLLM may replace its cached client.
        self._client = client
        self._scripts: dict[str, Any] = {}
        self._timeout = timeout_seconds
        self._cooldown = cooldown_seconds
        self._broken_until = 0.0

    @property
    def client(self) -> Any:
        client = self._client
        if callable(client) and not hasattr(client, "execute_command"):
            return client()
        return client

    async def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` atomically with ``keys`` and ``args``; return its raw reply."""
        if self._broken_until and time.monotonic() < self._broken_until:
            raise StoreError(f"redis script {name!r} skipped: Redis failed less than {self._cooldown:g}s ago")
        client = self.client
        script = self._scripts.get(name)
        if script is None:
            script = client.register_script(load_lua(name))
            self._scripts[name] = script
        try:
            reply = await asyncio.wait_for(script(keys=keys, args=args, client=client), self._timeout)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            # A busy client (its pool exhausted by a burst) is not a down Redis: fail this call only.
            if not isinstance(exc, _POOL_EXHAUSTED):
                self._broken_until = time.monotonic() + self._cooldown
            # The message never includes the connection URL (it may hold a password).
            raise StoreError(f"redis script {name!r} failed: {type(exc).__name__}: {_safe(exc)}") from exc
        self._broken_until = 0.0
        return reply


try:
    from redis.exceptions import MaxConnectionsError as _POOL_EXHAUSTED
except ImportError:  # redis-py before 6
    _POOL_EXHAUSTED = ()  # type: ignore[assignment,misc]


def _safe(exc: BaseException) -> str:
    text = str(exc)
    return "" if "://" in text or "@" in text else text
