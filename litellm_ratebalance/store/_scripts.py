"""Loading of the packaged Lua scripts and running them with NOSCRIPT recovery.

Each ``lua/<name>.lua`` file is one atomic operation and opens with a comment stating its KEYS, ARGV
(with units), return value and clock (always Redis ``TIME``). Scripts are registered with redis-py's
``register_script``, whose ``AsyncScript`` sends EVALSHA and reloads the script on NOSCRIPT (after a
``SCRIPT FLUSH`` or a Redis restart); we never hand-roll EVALSHA.
"""

from __future__ import annotations

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

    __slots__ = ("_client", "_scripts")

    def __init__(self, client: Any | Callable[[], Any]) -> None:
        # A callable is asked for the client at each call: LiteLLM may replace its cached client.
        self._client = client
        self._scripts: dict[str, Any] = {}

    @property
    def client(self) -> Any:
        client = self._client
        if callable(client) and not hasattr(client, "execute_command"):
            return client()
        return client

    async def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` atomically with ``keys`` and ``args``; return its raw reply."""
        client = self.client
        script = self._scripts.get(name)
        if script is None:
            script = client.register_script(load_lua(name))
            self._scripts[name] = script
        try:
            return await script(keys=keys, args=args, client=client)
        except RedisError as exc:
            raise StoreError(f"redis script {name!r} failed: {type(exc).__name__}: {exc}") from exc
        except OSError as exc:  # socket errors that redis-py did not wrap
            raise StoreError(f"redis script {name!r} failed: {type(exc).__name__}") from exc
