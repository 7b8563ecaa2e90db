"""What the proxy replicas in front of one deployment tell each other, and how each pools it: pure (no I/O, no
clock; the store carries the states, :mod:`litellm_ratebalance.store.peers`).

Several replicas protect one server only if they protect it as one: each learns from its own share of the
traffic, so left alone they would each learn a concurrency limit of their own (the leases alive across all
replicas are capped by whichever replica asks, so the total could reach the largest), an answer length from
a third of the answers, and a top-tier arrival rate a third of the whole (its reserve of slots a third too
small). Every ``signals.scrape_interval_seconds`` each replica publishes a :class:`PeerState` of each
deployment and reads the others'; :func:`pool` combines them:

* **limit**: the lowest of the live replicas' learned limits, so every replica caps the shared lease count
  at the same value and the total cannot pass any replica's measurement of the server;
* **answer lengths**: the replicas' histograms summed (the estimate of one proxy that saw every answer);
* **top tier's demand**: arrival rates and requests in flight summed (its reserve is for the whole tier).

A replica that stops publishing drops out once its state lapses (:data:`PEER_TTL_INTERVALS` intervals).
The tiers waiting in each replica's queue travel apart, at once, in the lease acquire (see
:mod:`litellm_ratebalance.store.peers`): a waiting top-tier request must hold back the lower tiers of every
replica within a round trip, not an interval.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "PEER_TTL_INTERVALS",
    "WAITING_TTL_SECONDS",
    "PeerState",
    "Pooled",
    "peer_ttl_seconds",
    "pool",
    "pooled_histogram",
]

PEER_TTL_INTERVALS = 3.0
"""A replica's state lapses after this many scrape intervals without an exchange (at least 3 s)."""

WAITING_TTL_SECONDS = 3.0
"""A replica's waiting entries lapse after this long unless renewed (every third of it while requests wait):
the longest a crashed replica's waiting request holds back the lower tiers of the others."""

Histogram = dict[int, tuple[float, float]]


@dataclass(frozen=True, slots=True)
class PeerState:
    """One replica's view of one deployment, as it publishes it."""

    limit: int
    """Its learned concurrency limit."""
    output: Histogram = field(default_factory=dict)
    """Its learned answer lengths: bucket -> (count, sum of tokens), decayed as it decays them."""
    top_rate: float = 0.0
    """Top-tier arrivals per second it sees."""
    top_inflight: int = 0
    """Its top-tier requests in flight."""

    def encode(self) -> str:
        return json.dumps(
            {
                "limit": self.limit,
                "output": [[b, c, t] for b, (c, t) in sorted(self.output.items())],
                "top_rate": self.top_rate,
                "top_inflight": self.top_inflight,
            },
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str) -> PeerState | None:
        """The state ``text`` holds, ``None`` when it is not one (another version's, or damaged): skipped."""
        try:
            raw = json.loads(text)
            limit = int(raw["limit"])
            output = {int(b): (float(c), float(t)) for b, c, t in raw.get("output", [])}
            rate = float(raw.get("top_rate", 0.0))
            inflight = int(raw.get("top_inflight", 0))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if limit < 1 or not math.isfinite(rate) or rate < 0 or inflight < 0:
            return None
        if any(c < 0 or t < 0 or not math.isfinite(c + t) for c, t in output.values()):
            return None
        return cls(limit, output, rate, inflight)


@dataclass(frozen=True, slots=True)
class Pooled:
    """What the other live replicas add to this one's view of a deployment (nothing: no peers)."""

    replicas: int = 0
    """Other live replicas."""
    limit: int | None = None
    """The lowest limit among them (``None``: none)."""
    output: Histogram = field(default_factory=dict)
    """Their answer-length histograms summed."""
    top_rate: float = 0.0
    top_inflight: int = 0

    def limit_with(self, own: int) -> int:
        """The limit every replica applies: the lowest of ``own`` and the others'."""
        return own if self.limit is None else min(own, self.limit)


def pool(states: Iterable[str | PeerState | None]) -> Pooled:
    """Combine the other replicas' states (undecodable ones skipped)."""
    decoded = [PeerState.decode(s) if isinstance(s, str) else s for s in states]
    peers = [s for s in decoded if s is not None]
    if not peers:
        return Pooled()
    output: Histogram = {}
    for peer in peers:
        for bucket, (count, total) in peer.output.items():
            have = output.get(bucket, (0.0, 0.0))
            output[bucket] = (have[0] + count, have[1] + total)
    return Pooled(
        replicas=len(peers),
        limit=min(p.limit for p in peers),
        output=output,
        top_rate=sum(p.top_rate for p in peers),
        top_inflight=sum(p.top_inflight for p in peers),
    )


def peer_ttl_seconds(scrape_interval_seconds: float) -> float:
    """How long a published state stays alive: :data:`PEER_TTL_INTERVALS` scrape intervals, at least 3 s."""
    return max(3.0, PEER_TTL_INTERVALS * scrape_interval_seconds)


def pooled_histogram(own: Mapping[int, tuple[float, float]], others: Mapping[int, tuple[float, float]]) -> Histogram:
    """``own`` plus ``others``, bucket by bucket."""
    merged = dict(own)
    for bucket, (count, total) in others.items():
        have = merged.get(bucket, (0.0, 0.0))
        merged[bucket] = (have[0] + count, have[1] + total)
    return merged
