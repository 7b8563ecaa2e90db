"""Settles, carry and the learned estimate through the store, on every backend; and the Redis script
against the embedded ledger on random sequences of operations."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from litellm_ratebalance.admission.estimate import DECAY_AT_SAMPLES, SettleBatch
from litellm_ratebalance.admission.ledger import RequestCost
from litellm_ratebalance.admission.policy import AdmissionLimits, RejectReason
from litellm_ratebalance.store import KeySpace, MemoryStore, RedisStore
from tests.store.admission_support import learn, settle

if TYPE_CHECKING:
    import redis.asyncio as aioredis

pytestmark = pytest.mark.redis

LEARNED = RequestCost(10, output_cap=32_768, prior=256)


def limits(**overrides: object) -> AdmissionLimits:
    base: dict[str, object] = dict(rpm=None, tpm=1000, saturation_threshold=1.0, pool="d", pool_rpm=None, pool_tpm=None)
    base.update(overrides)
    return AdmissionLimits(**base)  # type: ignore[arg-type]


async def test_the_prior_applies_until_a_sample_is_learned(store: MemoryStore | RedisStore) -> None:
    first = await store.acquire("m", limits(), LEARNED, 60_000)
    assert first.cost_tokens == 266 and first.estimate is None
    await learn(store, "m", 20, 20, 21)
    second = await store.acquire("m", limits(), LEARNED, 60_000)
    assert second.estimate == pytest.approx(61 / 3) and second.cost_tokens == 10 + 20
    capped = await store.acquire("m", limits(), RequestCost(10, output_cap=4, prior=256), 60_000)
    assert capped.cost_tokens == 14
    snapshot = await store.admission_snapshot("m", 60_000)
    assert snapshot is not None and snapshot.estimate == pytest.approx(61 / 3)


async def test_settles_sent_with_an_admission_apply_before_it_is_decided(store: MemoryStore | RedisStore) -> None:
    """The quick start: tpm 60, 30-token answers (20 output), one at a time, nothing sent on its own."""
    lim = limits(tpm=60)
    pending: SettleBatch | None = None
    outcomes = []
    for _ in range(4):
        result = await store.acquire("m", lim, LEARNED, 60_000, settles=pending)
        outcomes.append(result.admitted)
        pending = None
        if result.admitted:
            pending = SettleBatch()
            pending.add(result.window_start_ms, "d", 30 - result.cost_tokens)
            pending.learn(20)
    assert outcomes == [True, True, False, False]
    snapshot = await store.admission_snapshot("m", 60_000)
    assert snapshot is not None and snapshot.tokens == 60 and snapshot.requests == 2


async def test_the_quantile_chooses_what_a_request_reserves(store: MemoryStore | RedisStore) -> None:
    await learn(store, "m", *([10] * 60 + [100] * 30 + [1000] * 10), quantile=0.5)
    assert (await store.acquire("m", limits(), LEARNED, 60_000, quantile=0.5)).cost_tokens == 10 + 10
    # The estimate is recomputed with the quantile of the next batch that brings samples.
    await learn(store, "m", 100, quantile=0.95)
    assert (await store.acquire("m", limits(), LEARNED, 60_000)).cost_tokens == 10 + 1000


async def test_the_histogram_forgets_old_answers(store: MemoryStore | RedisStore) -> None:
    await learn(store, "m", *([300] * (DECAY_AT_SAMPLES - 1)))
    assert (await store.acquire("m", limits(), LEARNED, 60_000)).estimate == 300
    means: list[float] = []
    for _ in range(3):  # each decay halves the old answers' weight
        await learn(store, "m", *([40] * DECAY_AT_SAMPLES))
        mean = (await store.acquire("m", limits(), LEARNED, 60_000)).estimate
        assert mean is not None
        means.append(mean)
    # 999 x 300 halved three times against 875 of the 40s: (124.875 x 300 + 875 x 40) / 999.875
    assert means[0] > means[1] > means[2] == pytest.approx(72.47, abs=0.01)
    await learn(store, "m", 40, quantile=0.5)
    assert (await store.acquire("m", limits(), LEARNED, 60_000)).estimate == 40


async def test_overshoot_is_carried_into_the_next_window(store: MemoryStore | RedisStore) -> None:
    # 1 s windows: each step has ample time on a loaded machine, and the next window follows directly.
    first = await store.acquire("m", limits(), 900, 1000)
    assert first.admitted
    await settle(store, "m", "d", first.window_start_ms, 300)  # the answer was longer: 1200 of 1000
    await asyncio.sleep(1.05)
    nxt = await store.acquire("m", limits(), 700, 1000)
    assert nxt.admitted and nxt.counters.tokens == 900  # 200 carried + 700
    refused = await store.acquire("m", limits(), 101, 1000)
    assert refused.reason is RejectReason.MODEL_TOKENS
    snapshot = await store.admission_snapshot("m", 1000)
    assert snapshot is not None and snapshot.carried_tokens == 200
    # A late settle of the previous window moves the carry: 1200 - 250 is under the limit.
    await settle(store, "m", "d", first.window_start_ms, -250)
    snapshot = await store.admission_snapshot("m", 1000)
    assert snapshot is not None and snapshot.carried_tokens == 0 and snapshot.tokens == 700


async def test_a_saturated_window_teaches_the_headroom(store: MemoryStore | RedisStore) -> None:
    # 1 s windows, as above: three windows in a row.
    first = await store.acquire("m", limits(), 900, 1000)
    assert (await store.acquire("m", limits(), 200, 1000)).reason is RejectReason.MODEL_TOKENS
    await settle(store, "m", "d", first.window_start_ms, 300)  # 1200 of 1000
    await asyncio.sleep(1.05)
    assert (await store.acquire("m", limits(), 10, 1000)).headroom == 0.0
    await asyncio.sleep(1.05)
    third = await store.acquire("m", limits(), 850, 1000)
    assert third.admitted and third.headroom == pytest.approx(60.0)  # 0.3 of the 200 it ended above
    refused = await store.acquire("m", limits(), 100, 1000)
    assert refused.reason is RejectReason.MODEL_TOKENS


async def test_the_headroom_comes_out_of_borrowing_not_out_of_a_teams_share(store: MemoryStore | RedisStore) -> None:
    """The docs' two teams (tpm 1000, 0.5 each, threshold 0.5) once a headroom of 60 is learned; 1 s windows."""
    first = await store.acquire("m", limits(), 900, 1000)
    assert (await store.acquire("m", limits(), 200, 1000)).reason is RejectReason.MODEL_TOKENS
    await settle(store, "m", "d", first.window_start_ms, 300)  # 1200 of 1000
    await asyncio.sleep(1.05)
    await store.acquire("m", limits(), 10, 1000)
    await asyncio.sleep(1.05)
    team_a = limits(pool="p.team_a", pool_tpm=500.0, saturation_threshold=0.5)
    team_b = limits(pool="p.team_b", pool_tpm=500.0, saturation_threshold=0.5)
    third = await store.acquire("m", team_a, 500, 1000)
    assert third.admitted and third.headroom == pytest.approx(60.0)
    assert (await store.acquire("m", team_b, 350, 1000)).admitted
    # Past what borrowing may take (940) but within team_b's share: admitted, up to the tpm.
    within = await store.acquire("m", team_b, 100, 1000)
    assert within.admitted and within.counters.tokens == 950
    borrowing = await store.acquire("m", team_b, 100, 1000)
    assert borrowing.reason is RejectReason.MODEL_TOKENS
    await settle(store, "m", "p.team_b", third.window_start_ms, 30)  # the window ends at 980
    await asyncio.sleep(1.05)
    assert (await store.acquire("m", team_a, 1, 1000)).headroom == pytest.approx(60.0)
    await asyncio.sleep(1.05)
    # It admitted against 1000 - 60 + the 10 team_b took, and ended 30 above that: 0.7 x 60 + 0.3 x 30.
    assert (await store.acquire("m", team_a, 1, 1000)).headroom == pytest.approx(51.0)


async def test_a_late_answer_of_an_older_window_is_paid_for_now(store: MemoryStore | RedisStore) -> None:
    first = await store.acquire("m", limits(), 100, 1000)
    await asyncio.sleep(1.05)
    await store.acquire("m", limits(), 100, 1000)
    await asyncio.sleep(1.05)
    third = await store.acquire("m", limits(), 100, 1000)
    assert third.counters.tokens == 100
    await settle(store, "m", "d", first.window_start_ms, -60)  # shorter: its room is gone with its window
    await settle(store, "m", "d", first.window_start_ms, 80)  # longer: served, so counted now
    snapshot = await store.admission_snapshot("m", 1000)
    assert snapshot is not None and snapshot.tokens == 180


async def test_strict_mode_on_tokens_caps_the_pool_with_learned_costs(store: MemoryStore | RedisStore) -> None:
    await learn(store, "m", 90)
    lim = limits(tpm=1000, saturation_threshold=0.5, pool="p.a", pool_tpm=400.0)
    results = [await store.acquire("m", lim, LEARNED, 60_000) for _ in range(6)]
    # 100 tokens each: lenient to 500 (the pool already past its 400), strict from then on.
    assert [r.admitted for r in results] == [True] * 5 + [False]
    assert results[-1].reason is RejectReason.POOL_TOKENS and results[-1].strict


# -- the Redis script against the embedded ledger ------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Step:
    kind: str  # "acquire" | "flush"
    pool: str = "d"
    fixed: int = 0
    cap: int | None = None
    deltas: tuple[tuple[int, str, int, int], ...] = ()
    """(0 = this window, -1 = an older one; pool; tokens; requests)."""
    samples: tuple[int, ...] = ()


POOLS = ("d", "p.a")
steps = st.one_of(
    st.builds(
        Step,
        kind=st.just("acquire"),
        pool=st.sampled_from(POOLS),
        fixed=st.integers(0, 400),
        cap=st.one_of(st.none(), st.integers(0, 600)),
        samples=st.lists(st.integers(0, 2000), max_size=3).map(tuple),
        deltas=st.lists(
            st.tuples(
                st.sampled_from([0, -1]), st.sampled_from(POOLS), st.integers(-300, 300), st.sampled_from([0, -1])
            ),
            max_size=3,
        ).map(tuple),
    ),
    st.builds(
        Step,
        kind=st.just("flush"),
        samples=st.lists(st.integers(0, 2000), max_size=4).map(tuple),
        deltas=st.lists(
            st.tuples(
                st.sampled_from([0, -1]), st.sampled_from(POOLS), st.integers(-300, 300), st.sampled_from([0, -1])
            ),
            max_size=3,
        ).map(tuple),
    ),
)


def _batch(step: Step, window_start: int) -> SettleBatch:
    out = SettleBatch()
    for which, pool, tokens, requests in step.deltas:
        start = window_start if which == 0 else window_start - 123_456
        out.add(start, pool, tokens, requests if which == 0 else 0)
    for sample in step.samples:
        out.learn(sample)
    return out


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    sequence=st.lists(steps, min_size=1, max_size=12),
    tpm=st.sampled_from([None, 500, 3000]),
    rpm=st.sampled_from([None, 4, 50]),
    quantile=st.sampled_from([None, 0.0, 0.5, 0.9, 1.0]),
)
async def test_script_keeps_the_same_ledger_as_the_embedded_store(
    redis_client: aioredis.Redis, sequence: list[Step], tpm: int | None, rpm: int | None, quantile: float | None
) -> None:
    await redis_client.flushdb()
    redis_store = RedisStore(redis_client, KeySpace("rbdiff"))
    memory_store = MemoryStore(KeySpace("rbdiff"))
    starts: dict[str, int] = {}
    for step in sequence:
        seen: list[tuple[object, ...] | None] = []
        for name, store in (("memory", memory_store), ("redis", redis_store)):
            start = starts.get(name, 0)
            batch = _batch(step, start) if start else SettleBatch()
            if step.kind == "flush":
                await store.flush("m", batch, quantile=quantile)
                seen.append(None)
                continue
            lim = limits(
                rpm=rpm,
                tpm=tpm,
                saturation_threshold=0.5,
                pool=step.pool,
                pool_tpm=None if tpm is None else 0.3 * tpm,
                pool_rpm=None if rpm is None else 0.5 * rpm,
            )
            cost = RequestCost(step.fixed, output_cap=step.cap, prior=256)
            result = await store.acquire("m", lim, cost, 60_000, settles=batch, quantile=quantile)
            starts[name] = result.window_start_ms
            counts = result.counters
            decision = (result.admitted, result.reason, result.strict, result.cost_tokens, result.estimate)
            seen.append((*decision, counts.requests, counts.tokens, counts.pool_requests, counts.pool_tokens))
        assert seen[0] == seen[1], step
    memory_view = await memory_store.admission_snapshot("m", 60_000)
    redis_view = await redis_store.admission_snapshot("m", 60_000)
    if memory_view is None or redis_view is None:
        assert memory_view is redis_view is None
        return
    assert (memory_view.requests, memory_view.tokens, memory_view.carried_tokens, memory_view.estimate) == (
        redis_view.requests,
        redis_view.tokens,
        redis_view.carried_tokens,
        redis_view.estimate,
    )
    assert {k: v for k, v in memory_view.pools.items() if v != (0, 0)} == {
        k: v for k, v in redis_view.pools.items() if v != (0, 0)
    }
