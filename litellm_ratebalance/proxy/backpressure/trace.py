"""A debug trace of backpressure's admission decisions, one JSON object per line, off by default.

Set the environment variable :data:`TRACE_ENV` to a file path before the proxy starts and every replica
appends to that file (``O_APPEND``: several processes may share one file; each line is one ``write``):

* ``route``: the routing filter judged a request (its tier and the verdict);
* ``arrive``: the deployment hook starts admitting a request (the verdict it finds);
* ``lease``: a lease was taken (``how``: ``direct`` or ``queue``, the wait, the store's counts after it; ``sent``:
  when the acquire left this process, ``t`` being when its reply was read);
* ``store_refused``: the store's atomic check refused a lease (``refusal``: ``slots``, ``tokens``, ``waiting``;
  ``sent`` as for ``lease``);
* ``publish``: the tiers waiting in this process's queue (``ranks``) were written to the store (``sent``: when
  the write left; ``t``: when it was confirmed);
* ``enqueue`` / ``head``: a request joined the wait queue / the dispatcher tried the head (its verdict);
* ``refuse``: a refusal was built for a request (every refusal, once);
* ``release``: a lease was given back (how long it was held).

Every line carries the wall-clock time ``t`` (``time.time()``: the lines of several processes on one host
sort together), the process id, the deployment, the request's call id and tier, and this process's view at
that moment: the applied limit, the shared in-flight count and reserved tokens as last read, the scraped
KV-cache usage (``kv``: a 0-1 fraction, less what finished since the scrape), the top tier's reserve and
requests in flight, the queue length, and this process's leases per tier (count and tokens). Nothing is
traced while the variable is unset; the trace is for diagnosis (``bench/bench_backpressure.py --trace``), not
for production use: it costs a file write per event.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from litellm_ratebalance.overload.shedding import Verdict
    from litellm_ratebalance.proxy.backpressure.book import Context, DeploymentState, Profile

__all__ = ["TRACE_ENV", "Trace", "verdict_fields"]

TRACE_ENV = "LITELLM_RATEBALANCE_BACKPRESSURE_TRACE"
"""The environment variable naming the trace file (unset: no trace)."""

logger = logging.getLogger("litellm_ratebalance.backpressure")


def verdict_fields(verdict: Verdict) -> dict[str, Any]:
    """What a trace line says of a verdict."""
    return {
        "admitted": verdict.admitted,
        "reason": None if verdict.reason is None else verdict.reason.value,
        "signal": verdict.signal,
        "slots": verdict.slots,
        "token_cap": verdict.token_cap,
        "lease_token_cap": verdict.lease_token_cap,
        "higher_waiting": verdict.higher_waiting,
        "queueable": verdict.queueable,
    }


class Trace:
    """The trace writer of one context; :attr:`enabled` is false (and :meth:`event` does nothing) without a
    file."""

    __slots__ = ("_fd", "_pid")

    def __init__(self, path: str | None) -> None:
        self._pid = os.getpid()
        self._fd: int | None = None
        if path:
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as exc:
                logger.warning("litellm_ratebalance backpressure: cannot open the trace file %s: %s", path, exc)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Trace:
        return cls(environ.get(TRACE_ENV) or None)

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def event(
        self,
        kind: str,
        ctx: Context,
        state: DeploymentState,
        profile: Profile | None = None,
        call_id: str | None = None,
        **fields: Any,
    ) -> None:
        """Append one line: ``kind``, the request (``profile``, ``call_id``), ``fields`` and ``state`` as this
        process sees it now."""
        if self._fd is None:
            return
        tiers: dict[str, list[int]] = {}
        for lease in state.leases.values():
            count = tiers.setdefault(lease.profile.tier, [0, 0])
            count[0] += 1
            count[1] += lease.cost
        line = {
            "t": time.time(),
            "pid": self._pid,
            "ev": kind,
            "dep": state.deployment_id,
            "call": call_id,
            "tier": None if profile is None else profile.tier,
            **fields,
            "limit": state.applied_limit,
            "inflight": state.inflight,
            "reserved": state.reserved_tokens,
            "kv": ctx.server_signals(state).get("kv_cache"),
            "top_reserve": ctx.top_reserve(state),
            "top_inflight": state.top_inflight + state.peers.top_inflight,
            "queue": len(state.queue),
            "local": tiers,
        }
        with contextlib.suppress(OSError):  # a debug aid: a full disk must not fail a request
            os.write(self._fd, (json.dumps(line, default=str) + "\n").encode())
