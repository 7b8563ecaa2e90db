"""``admission_acquire.lua`` decides exactly like :func:`~litellm_ratebalance.admission.policy.decide`.

The embedded store calls ``decide()`` itself; the Redis store runs the script, which restates the same rules
in Lua. Here both get the same random live window (counts of the model, of the request's pool and of the
pools whose floors apply), the same limits, the same learned headroom and the same request size (an ``int``
cost: a fixed reservation, so the learned output estimate plays no part), and must give the same decision:
admitted, reason, strict, saturation and the room the floors hold back.

The window is seeded by writing the hash fields the script's header documents (``start``, ``r``, ``t``,
``r:<pool>``, ``t:<pool>``) with ``start`` a moment before the server's ``TIME``, so the script decides on
that window instead of starting a new one; the headroom is the estimate hash's ``h``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, Phase, event, example, find, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, SearchStrategy

from litellm_ratebalance.admission.policy import (
    AdmissionLimits,
    Decision,
    Floor,
    RejectReason,
    WindowCounters,
    decide,
    protected_room,
    saturation,
)
from litellm_ratebalance.store import KeySpace, RedisStore

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis.asyncio as aioredis
    from redis.typing import EncodableT, FieldT

MODEL = "m"
WINDOW_MS = 60_000
POOLS = ("d", "p.a", "p.b", "p.c")
"""The default pool and three configured priorities' fields; a request's pool is one, floors name others."""


@dataclass(frozen=True, slots=True)
class Case:
    """One decision to make: a live window's counts, the request's limits and its token estimate."""

    counters: WindowCounters
    limits: AdmissionLimits
    cost: int
    write_zeros: bool = False
    """Write counters that are 0 as fields (a window after settles) instead of leaving them absent."""
    headroom: float = 0.0
    """The learned headroom (tokens of the tpm that borrowing leaves free)."""

    def window_hash(self, start_ms: int) -> dict[FieldT, EncodableT]:
        """The live window's hash, with the fields the script's header names."""
        pool = self.limits.pool
        values: dict[FieldT, EncodableT] = {
            "r": self.counters.requests,
            "t": self.counters.tokens,
            f"r:{pool}": self.counters.pool_requests,
            f"t:{pool}": self.counters.pool_tokens,
        }
        for other, (requests, tokens) in (self.counters.other_pools or {}).items():
            values[f"r:{other}"] = requests
            values[f"t:{other}"] = tokens
        return {"start": start_ms, **{name: value for name, value in values.items() if value or self.write_zeros}}

    def expected(self) -> Decision:
        return decide(self.counters, self.limits, self.cost, self.headroom)


def _share(capacity: int | None) -> SearchStrategy[float | None]:
    """A pool's strict-mode cap as ``build_limits`` computes it (weight x capacity), or no cap."""
    if capacity is None:
        return st.none()
    weights = st.sampled_from([0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 1.0]) | st.floats(0.0, 1.0)
    return st.none() | weights.map(lambda weight: weight * capacity)


def _near(draw: DrawFn, top: int, edges: list[float]) -> int:
    """A count in 0..top, or one at, just under or just over one of ``edges`` (where the rules flip)."""
    points = sorted({max(0, f(edge) + step) for edge in edges for f in (math.floor, math.ceil) for step in (-1, 0, 1)})
    if draw(st.booleans()) and points:
        return draw(st.sampled_from(points))
    return draw(st.integers(0, max(top, 0)))


def _under(draw: DrawFn, edge: float) -> int:
    """A count in 0..edge (where the next request still fits), 0 when nothing fits."""
    return draw(st.integers(0, max(0, math.floor(edge))))


@st.composite
def cases(draw: DrawFn) -> Case:
    pool = draw(st.sampled_from(POOLS))
    rpm = draw(st.none() | st.integers(0, 30))
    tpm = draw(st.none() | st.integers(0, 2_000))
    token_scale = tpm if tpm is not None else 500
    # Small requests, and ones larger than the whole limit (the oversize rule).
    cost = draw(st.integers(0, 60) | st.integers(0, 2 * token_scale + 10))
    pool_rpm = draw(_share(rpm))
    pool_tpm = draw(_share(tpm))
    headroom = 0.0 if tpm is None else draw(st.just(0.0) | st.floats(0.0, 0.2 * tpm) | st.integers(0, tpm // 5))

    floors: list[Floor] = []
    other_pools: dict[str, tuple[int, int]] = {}
    for other in POOLS:
        if other == pool:
            continue
        kept = 0.0
        if draw(st.booleans()):
            # (1 - lendable) x weight x capacity, as build_limits computes a floor.
            kept = draw(st.sampled_from([0.1, 0.2, 0.4, 0.5]) | st.floats(0.0, 1.0)) * (
                1.0 - draw(st.sampled_from([0.0, 0.5]) | st.floats(0.0, 1.0))
            )
            floors.append(Floor(other, kept * (rpm or 0), kept * (tpm or 0)))
        # Other pools' use: under, at or past their floor (only the floor pools' counts matter).
        other_pools[other] = (
            _near(draw, (rpm or 30) // 2, [kept * (rpm or 0)]),
            _near(draw, token_scale // 2, [kept * (tpm or 0)]),
        )
    limits_without_threshold = AdmissionLimits(rpm, tpm, 0.0, pool, pool_rpm, pool_tpm, tuple(floors))
    held_requests, held_tokens = protected_room(limits_without_threshold, WindowCounters(other_pools=other_pools))

    # The model's and the pool's counts near where each check flips. The rules never compare a pool's
    # count with the model's, so they are drawn independently.
    request_edges = [rpm - held_requests - 1, rpm - 1] if rpm is not None else []
    token_edges = (
        [
            tpm - held_tokens - min(cost, tpm - held_tokens),
            tpm - held_tokens - headroom - min(cost, tpm - held_tokens - headroom),
            tpm - cost,
        ]
        if tpm is not None
        else []
    )
    # Half the time the model-wide checks pass, so that the pool checks behind them decide.
    model_fits = draw(st.booleans())
    requests = (
        _under(draw, request_edges[0]) if model_fits and request_edges else _near(draw, (rpm or 30) + 2, request_edges)
    )
    tokens = (
        _under(draw, token_edges[0]) if model_fits and token_edges else _near(draw, token_scale + cost, token_edges)
    )
    # Likewise the pool's request check, so that its token check decides.
    if pool_rpm is not None and draw(st.booleans()):
        pool_requests = _under(draw, pool_rpm - 1)
    else:
        pool_requests = _near(draw, (rpm or 30) + 2, [pool_rpm - 1] if pool_rpm is not None else [])
    pool_tokens = _near(draw, token_scale + cost, [pool_tpm - min(cost, pool_tpm)] if pool_tpm is not None else [])

    # The threshold anywhere, or exactly at (or a hair above) this window's saturation: strict starts at >=.
    sat = saturation(requests, tokens, rpm, tpm)
    thresholds = st.floats(0.0, 1.0) | st.sampled_from([0.0, 0.5, 1.0])
    if sat <= 1.0:
        thresholds |= st.sampled_from([sat, math.nextafter(sat, math.inf)])
    threshold = draw(thresholds)

    return Case(
        counters=WindowCounters(requests, tokens, pool_requests, pool_tokens, other_pools),
        limits=AdmissionLimits(rpm, tpm, threshold, pool, pool_rpm, pool_tpm, tuple(floors)),
        cost=cost,
        write_zeros=draw(st.booleans()),
        headroom=float(headroom),
    )


def _case(
    counters: tuple[int, int, int, int],
    *,
    rpm: int | None = None,
    tpm: int | None = None,
    threshold: float = 0.5,
    pool_rpm: float | None = None,
    pool_tpm: float | None = None,
    cost: int = 0,
    floors: tuple[Floor, ...] = (),
    others: dict[str, tuple[int, int]] | None = None,
    headroom: float = 0.0,
) -> Case:
    return Case(
        WindowCounters(*counters, other_pools=others or {}),
        AdmissionLimits(rpm, tpm, threshold, "p.a", pool_rpm, pool_tpm, floors),
        cost,
        headroom=headroom,
    )


# Always checked, whatever the random draw: one case per rule (the random cases reach them too, see
# test_generator_reaches_every_rule).
POOL_TOKENS_STRICT = _case((5, 600, 1, 250), tpm=1000, pool_tpm=300.0, cost=100)
POOL_REQUESTS_STRICT = _case((6, 0, 3, 0), rpm=10, pool_rpm=3.0)
MODEL_TOKENS_WITH_FLOOR = _case(
    (1, 500, 1, 500), tpm=1000, cost=301, floors=(Floor("p.b", 0.0, 300.0),), others={"p.b": (0, 100)}
)
MODEL_REQUESTS_WITH_FLOOR = _case((6, 0, 6, 0), rpm=10, threshold=1.0, floors=(Floor("p.b", 4.0, 0.0),))
OVERSIZE_INTO_EMPTY_POOL_SHARE = _case((1, 500, 0, 0), tpm=1000, pool_tpm=300.0, cost=400)
AT_THRESHOLD_EXACTLY = _case((3, 0, 3, 0), rpm=10, threshold=0.3, pool_rpm=3.0)
WITHIN_SHARE_PAST_THE_HEADROOM = _case((14, 850, 6, 350), tpm=1000, pool_tpm=500.0, cost=60, headroom=100.0)
BORROWING_INTO_THE_HEADROOM = _case((14, 850, 6, 480), tpm=1000, threshold=1.0, pool_tpm=500.0, cost=60, headroom=100.0)


@pytest.mark.redis
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
@example(case=POOL_TOKENS_STRICT)
@example(case=POOL_REQUESTS_STRICT)
@example(case=MODEL_TOKENS_WITH_FLOOR)
@example(case=MODEL_REQUESTS_WITH_FLOOR)
@example(case=OVERSIZE_INTO_EMPTY_POOL_SHARE)
@example(case=AT_THRESHOLD_EXACTLY)
@example(case=WITHIN_SHARE_PAST_THE_HEADROOM)
@example(case=BORROWING_INTO_THE_HEADROOM)
async def test_script_decides_like_decide(redis_client: aioredis.Redis, case: Case) -> None:
    # The fixture's client is shared by all examples; each example rewrites the whole window hash.
    store = RedisStore(redis_client, KeySpace("rbparity"))
    key = store.keys.admission_window(MODEL)
    estimate_key = store.keys.admission_estimate(MODEL)
    seconds, microseconds = await redis_client.time()
    start = seconds * 1000 + microseconds // 1000 - 1000
    await redis_client.delete(key, estimate_key)
    await redis_client.hset(key, mapping=case.window_hash(start))
    if case.headroom:
        await redis_client.hset(estimate_key, "h", repr(case.headroom))

    got = await store.acquire(MODEL, case.limits, case.cost, WINDOW_MS)
    want = case.expected()
    event(f"{want.reason.name}, {'strict' if want.strict else 'lenient'}")

    assert got.window_start_ms == start, "the script started a new window instead of deciding on the seeded one"
    assert got.cost_tokens == case.cost, "an int cost is a fixed reservation, the size decide() was given"
    assert (got.admitted, got.reason, got.strict) == (want.admitted, want.reason, want.strict)
    # The script returns saturation and held room through Lua's tostring (14 significant digits); the
    # decision itself (strict, fits) compares the full doubles, checked exactly above.
    assert got.saturation == pytest.approx(want.saturation, rel=1e-12, abs=1e-12)
    held = protected_room(case.limits, case.counters)
    assert (got.held_requests, got.held_tokens) == pytest.approx(held, rel=1e-12, abs=1e-9)


def _oversize(case: Case) -> bool:
    """Admitted although the request's tokens exceed the model's or (in strict mode) its pool's cap."""
    decision = case.expected()
    limits = case.limits
    over_model = limits.tpm is not None and case.cost > limits.tpm
    over_pool = decision.strict and limits.pool_tpm is not None and case.cost > limits.pool_tpm
    return decision.admitted and (over_model or over_pool)


def _floor_refuses(case: Case) -> bool:
    """Refused model-wide only because another pool's floor holds room back."""
    without_floors = AdmissionLimits(
        case.limits.rpm,
        case.limits.tpm,
        case.limits.saturation_threshold,
        case.limits.pool,
        case.limits.pool_rpm,
        case.limits.pool_tpm,
    )
    return not case.expected().admitted and decide(case.counters, without_floors, case.cost).admitted


def _within_share_past_the_headroom(case: Case) -> bool:
    """Admitted within its pool's share where borrowing would have to leave the headroom free."""
    limits = case.limits
    if limits.tpm is None or limits.pool_tpm is None or not case.expected().admitted:
        return False
    _, held_tokens = protected_room(limits, case.counters)
    return case.counters.tokens + case.cost > limits.tpm - held_tokens - case.headroom


RULES: dict[str, Callable[[Case], bool]] = {
    "refused: model requests": lambda c: c.expected().reason is RejectReason.MODEL_REQUESTS,
    "refused: model tokens": lambda c: c.expected().reason is RejectReason.MODEL_TOKENS,
    "refused: pool requests": lambda c: c.expected().reason is RejectReason.POOL_REQUESTS,
    "refused: pool tokens": lambda c: c.expected().reason is RejectReason.POOL_TOKENS,
    "admitted, strict": lambda c: c.expected().admitted and c.expected().strict,
    "admitted, lenient": lambda c: c.expected().admitted and not c.expected().strict,
    "strict at the threshold exactly": lambda c: c.expected().saturation == c.limits.saturation_threshold,
    "refused by a floor": _floor_refuses,
    "oversize request admitted": _oversize,
    "admitted within its share past the headroom": _within_share_past_the_headroom,
    "refused for borrowing into the headroom": lambda c: (
        c.expected().reason is RejectReason.MODEL_TOKENS and decide(c.counters, c.limits, c.cost).admitted
    ),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_generator_reaches_every_rule(rule: str) -> None:
    """The random cases above are worth something only if they reach each branch of the rules."""
    # The first example found is enough: no shrinking (which would only cost time).
    find(cases(), RULES[rule], settings=settings(max_examples=2_000, database=None, phases=[Phase.generate]))
