"""The pooling of what the proxy replicas of one deployment publish (``overload/peers.py``), the pooled answer
estimate, the shared top-tier demand and the overflow log's pacing."""

from __future__ import annotations

from litellm_ratebalance.overload.output import MIN_SAMPLES, OutputEstimate
from litellm_ratebalance.overload.peers import PeerState, Pooled, peer_ttl_seconds, pool
from litellm_ratebalance.overload.reserve import TopDemand
from litellm_ratebalance.overload.signals import LogOnce, is_overflow_error


def test_a_state_survives_its_encoding_and_damaged_ones_are_skipped() -> None:
    state = PeerState(7, {12: (3.0, 300.0)}, 0.5, 2)
    assert PeerState.decode(state.encode()) == state
    for bad in (
        "",
        "{}",
        "[1]",
        '{"limit": 0}',
        '{"limit": 3, "top_rate": -1}',
        '{"limit": 3, "output": [[1, -1, 2]]}',
    ):
        assert PeerState.decode(bad) is None
    assert pool(["not json", None]) == Pooled()


def test_pool_takes_the_lowest_limit_and_sums_demand_and_answers() -> None:
    pooled = pool(
        [PeerState(9, {1: (1.0, 2.0)}, 0.5, 1).encode(), PeerState(7, {1: (2.0, 4.0), 2: (1.0, 5.0)}, 1.0, 2)]
    )
    assert pooled.replicas == 2 and pooled.limit == 7
    assert pooled.output == {1: (3.0, 6.0), 2: (1.0, 5.0)}
    assert pooled.top_rate == 1.5 and pooled.top_inflight == 3
    assert pooled.limit_with(12) == 7 and pooled.limit_with(5) == 5
    assert Pooled().limit_with(12) == 12


def test_the_output_estimate_pools_the_peers_answers() -> None:
    mine, theirs = OutputEstimate(), OutputEstimate()
    for _ in range(MIN_SAMPLES // 2):
        mine.learn(100)
        theirs.learn(300)
    assert mine.estimate() is None  # too few alone
    mine.set_peers(theirs.histogram())
    pooled = mine.estimate()
    assert pooled is not None and 150 < pooled < 250  # the mean of both replicas' answers
    mine.set_peers({})
    assert mine.estimate() is None


def test_the_top_reserve_counts_the_other_replicas_arrivals() -> None:
    demand = TopDemand()
    for i in range(31):
        demand.arrive(float(i))  # 1 per second here
    demand.served(2.0)
    alone = demand.reserve(30.0, 0.9)
    together = demand.reserve(30.0, 0.9, other_rate=2.0)  # two more replicas seeing as many
    assert together > alone >= 1


def test_peer_states_outlive_a_few_scrape_intervals() -> None:
    assert peer_ttl_seconds(1.0) == 3.0 and peer_ttl_seconds(5.0) == 15.0


def test_overflows_are_logged_at_most_once_per_interval_with_the_count_between() -> None:
    log = LogOnce()
    assert log.to_log(1, 0.0, 60.0) == 1
    assert log.to_log(1, 1.0, 60.0) is None and log.to_log(1, 2.0, 60.0) is None
    assert log.to_log(1, 61.0, 60.0) == 3
    assert is_overflow_error("CUDA out of memory (simulated): needed 3100 KV-cache tokens")
    assert is_overflow_error("torch.OutOfMemoryError: ...") and not is_overflow_error("upstream timed out")
