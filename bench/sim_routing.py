"""Offline routing simulation: the benchmark's scenarios on a virtual clock, in seconds instead of minutes.

The real benchmark (``bench_routing.py``) runs LiteLLM's Router against mock servers on loopback, 12 s of wall
time per run, on a machine whose load moves its figures by several tokens/s. This one replays the same seeded
request plans against a model of the same mock deployments (base latency, prefill, decode at the true rate
times the same per-request jitter draw, processor sharing beyond ``capacity``, the same 5xx, stall and 429
draws, token budgets with their ``x-ratelimit-*`` figures), with our balancer on a virtual clock (its store
in memory on the same clock), least-busy (fewest requests in flight, ties drawn) and the oracle's rule. Ours
and least-busy see LiteLLM's default cooldowns as the Router applies them (a 429 cools a deployment down for
its ``retry-after``; more than half of at least 5 requests failed, for 5 s); the oracle ignores them, as in
the real bench. ``--limited-oracle LAG`` adds the oracle's rule limited to what a learner can know: each
deployment's behaviour as it was LAG seconds ago, the Router's cooldowns, and with ``--blind`` no answer length
beyond ``max_tokens``; what separates it from the oracle is information no learner has in time. It is a tool
for trying ideas on many seeds; every figure reported comes from the real bench.

Usage::

    python bench/sim_routing.py --scenarios drift mixed-slots --seeds 1-40
    python bench/sim_routing.py --scenarios drift --seeds 1-8 --ours presume_slots=false
    python bench/sim_routing.py --scenarios drift flaky --seeds 1-16 --limited-oracle 1 --blind
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import itertools

from litellm_ratebalance.routing import Candidate, RateBalancer, RoutingSettings
from litellm_ratebalance.routing.records import RateLimitObservation
from litellm_ratebalance.simulate.mock_openai import Behaviour, UsageWindow
from litellm_ratebalance.simulate.oracle import expected_effective_rate
from litellm_ratebalance.simulate.scenarios import PlannedRequest, Scenario, build_scenario
from litellm_ratebalance.store import MemoryStore

RATIO = 250.0
TRACE_EVERY = 1.0
STEP = 0.005
"""Seconds per simulation step."""
ORACLE_LAG = 0.0
"""``oracle-limited`` (``--limited-oracle``): it sees each deployment's behaviour as it was this many seconds
ago, the time a learner needs before answers can show a change."""
ORACLE_BLIND = False
"""``oracle-limited``: it does not know the answer's length either, only what a learner sees: ``max_tokens``
where the request sets it, else the plan's mean answer."""
OVERHEAD = 0.004
"""Seconds between a request's arrival and the mock seeing it (routing and the client), and between its
answer and our record of it (LiteLLM's logging)."""
OURS_SETTINGS: dict[str, Any] = {
    "window_seconds": 5,
    "bucket_seconds": 1,
    "refresh_interval": 0.25,
    "failure_window_seconds": 2,
    "stall_min_seconds": 1.0,
    "rate_limit_header_max_age_seconds": 5.0,
}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Active:
    request: PlannedRequest
    deployment: str
    arrived: float
    speed: float
    base_left: float
    prefill_left: float
    """Full-speed seconds of prefill left."""
    tokens_left: float
    output: int
    fail_at: float | None = None
    first_token: float | None = None
    status: int = 200
    retry_after: float = 0.0


@dataclass
class Result:
    request: PlannedRequest
    deployment: str
    latency: float
    ok: bool
    rate: float
    started: float


@dataclass
class SimDeployment:
    name: str
    base: Behaviour
    timeline: Any
    rng: random.Random
    active: list[Active] = field(default_factory=list)
    usage: Any = None
    cooldown_until: float = -1.0
    successes: int = 0
    failures: int = 0

    def behaviour(self, t: float) -> Behaviour:
        from litellm_ratebalance.simulate.mock_openai import behaviour_at

        return behaviour_at(self.base, self.timeline, t)


def _output_tokens(request: PlannedRequest) -> int:
    return request.output_tokens


def simulate(scenario: Scenario, strategy: str, ours: dict[str, Any] | None = None, trace: bool = False) -> dict:
    """Run one strategy on a scenario; its mean effective rate and per-request results."""
    return asyncio.run(_simulate(scenario, strategy, ours or {}, trace))


async def _simulate(scenario: Scenario, strategy: str, ours: dict[str, Any], trace: bool) -> dict:
    clock = Clock()
    epoch = clock.now
    deployments = {
        spec.name: SimDeployment(
            spec.name, spec.behaviour, spec.timeline, random.Random(f"{spec.seed}/{spec.name}"), usage=UsageWindow()
        )
        for spec in scenario.deployments
    }
    names = list(deployments)
    group = "sim"
    balancer: RateBalancer | None = None
    slots = ours.pop("__slots", False) if ours else False
    candidates = tuple(
        Candidate(name, slots=float(spec.behaviour.capacity) if slots else None)
        for name, spec in zip(names, scenario.deployments, strict=True)
    )
    if strategy == "ours":
        settings = RoutingSettings(**{**OURS_SETTINGS, **ours})
        balancer = RateBalancer(
            MemoryStore(clock=clock), settings, clock=clock, rng=random.Random(f"ours/{scenario.name}/{scenario.seed}")
        )
    pick_rng = random.Random(f"{scenario.name}/{scenario.seed}/{strategy}")
    plan = scenario.plan()
    timeout = scenario.workload.timeout
    pending = list(plan)
    mean_answer = round(statistics.mean(_output_tokens(r) for r in plan)) if plan else 64
    pending_records: list[tuple[float, Result, RateLimitObservation | None]] = []
    results: list[Result] = []
    in_flight = dict.fromkeys(names, 0)
    t = 0.0
    end = scenario.workload.duration + timeout + 1.0
    traces: list[str] = []
    slot_stats: dict[tuple[str, str], int] = {}
    next_trace = 0.0
    while t < end and (pending or any(d.active for d in deployments.values()) or pending_records):
        clock.now = epoch + t
        # records due
        if pending_records:
            due = [p for p in pending_records if p[0] <= t]
            if due:
                pending_records = [p for p in pending_records if p[0] > t]
                for _, result, limits in due:
                    if balancer is not None:
                        balancer.record(
                            group,
                            result.deployment,
                            latency=result.latency,
                            input_tokens=result.request.prompt_tokens if result.ok else 0,
                            output_tokens=_output_tokens(result.request) if result.ok else 0,
                            ok=result.ok,
                            rate_limits=limits,
                            request_id=str(result.request.index),
                        )
        # arrivals
        while pending and pending[0].at <= t:
            request = pending.pop(0)
            work = None
            if request.max_tokens is not None:
                work = request.max_tokens + request.prompt_tokens / RATIO
            warm = [n for n in names if deployments[n].cooldown_until <= t] or list(names)
            if strategy == "ours":
                assert balancer is not None
                subset = tuple(c for c in candidates if c.id in warm)
                index = balancer.choose(group, subset, str(request.index), work=work)
                name = subset[index].id
            elif strategy == "least-busy":
                low = min(in_flight[n] for n in warm)
                name = pick_rng.choice([n for n in warm if in_flight[n] == low])
            elif strategy in ("oracle", "oracle-limited"):
                limited = strategy == "oracle-limited"
                seen = max(0.0, t - ORACLE_LAG) if limited else t
                output = _output_tokens(request)
                if limited and ORACLE_BLIND:
                    output = request.max_tokens if request.max_tokens is not None else mean_answer
                # The limited oracle routes through the Router as the learners do, cooldowns included.
                choices = warm if limited else names
                best, score = choices[0], -1.0
                for n in choices:
                    b = deployments[n].behaviour(seen)
                    left = True
                    if b.tpm is not None:
                        _, used = deployments[n].usage.usage(t, b.limit_window)
                        left = used + request.prompt_tokens + output <= b.tpm
                    s = expected_effective_rate(b, seen, in_flight[n], request.prompt_tokens, output, RATIO, left)
                    if s > score:
                        best, score = n, s
                name = best
            elif strategy == "shuffle":
                name = pick_rng.choice(names)
            else:
                raise ValueError(strategy)
            d = deployments[name]
            b = d.behaviour(t)
            error_draw, _stall, speed_draw = d.rng.random(), d.rng.random(), d.rng.gauss(0.0, 1.0)
            speed = math.exp(b.jitter * speed_draw) if b.jitter > 0 else 1.0
            a = Active(
                request,
                name,
                t,
                speed,
                b.base_latency + OVERHEAD,
                request.prompt_tokens / b.prefill_rate,
                float(_output_tokens(request)),
                _output_tokens(request),
            )
            tokens = request.prompt_tokens + _output_tokens(request)
            over = False
            if b.tpm is not None:
                _, used = d.usage.usage(t, b.limit_window)
                over = used + tokens > b.tpm
            if b.rate_limited or over:
                a.fail_at = t + b.error_latency + OVERHEAD
                a.status = 429
                a.retry_after = float(
                    max(
                        1, math.ceil(b.retry_after if b.rate_limited else d.usage.seconds_until_free(t, b.limit_window))
                    )
                )
            else:
                d.usage.charge(t, tokens)
                if error_draw < b.error_rate:
                    a.fail_at = t + b.error_latency + OVERHEAD
                    a.status = 500
                elif _stall < b.stall_rate:
                    a.base_left += b.stall_seconds
            d.active.append(a)
            in_flight[name] += 1
        # serve
        for d in deployments.values():
            if not d.active:
                continue
            b = d.behaviour(t)
            running = [a for a in d.active if a.fail_at is None and a.base_left <= b.base_latency + OVERHEAD]
            share = min(1.0, b.capacity / max(1, len(running)))
            rate = b.rate_at(t)
            done: list[tuple[Active, bool]] = []
            for a in d.active:
                if a.fail_at is not None:
                    if t >= a.fail_at:
                        done.append((a, False))
                    continue
                if t - a.arrived >= timeout:
                    a.status = 408
                    done.append((a, False))
                    continue
                step = STEP
                if a.base_left > 0:
                    used = min(step, a.base_left)
                    a.base_left -= used
                    step -= used
                if step > 0 and a.prefill_left > 0:
                    used = min(step * share, a.prefill_left)
                    a.prefill_left -= used
                    step -= used / share
                if step > 0 and a.tokens_left > 0:
                    a.tokens_left -= step * share * rate * a.speed
                    if a.tokens_left <= 1e-9:
                        done.append((a, True))
            for a, ok in done:
                d.active.remove(a)
                in_flight[d.name] -= 1
                latency = t + STEP - a.arrived
                eff = (a.output + a.request.prompt_tokens / RATIO) / latency if ok else 0.0
                result = Result(a.request, d.name, latency, ok, eff, a.arrived)
                results.append(result)
                limits = None
                if ok and b.tpm is not None:
                    _, used = d.usage.usage(t, b.limit_window)
                    limits = RateLimitObservation(
                        remaining_tokens=float(max(0, b.tpm - used)),
                        limit_tokens=float(b.tpm),
                        reset_seconds=d.usage.seconds_until_free(t, b.limit_window),
                    )
                pending_records.append((t + STEP + OVERHEAD, result, limits))
                if strategy != "oracle":
                    # LiteLLM's default cooldowns (Router): a 429 for its retry-after; more than half of at least
                    # 5 requests this minute failed, for 5 s.
                    if ok:
                        d.successes += 1
                    else:
                        d.failures += 1
                        total = d.successes + d.failures
                        if a.status == 429:
                            d.cooldown_until = max(d.cooldown_until, t + a.retry_after)
                        elif total >= 5 and d.failures / total > 0.5:
                            d.cooldown_until = max(d.cooldown_until, t + 5.0)
        if trace and balancer is not None and t >= next_trace:
            next_trace += TRACE_EVERY
            est = balancer.estimates(group, candidates)
            first = next(iter(est.values()))
            traces.append(
                f"t={t:5.2f} sla {first.sla or 0:3.0f} "
                + " | ".join(
                    f"{n}: sh {est[n].share:.2f} p {est[n].probability or 0:.2f} n {est[n].samples:.1f} "
                    f"m {est[n].mean_rate:.0f}+-{est[n].std_rate:.0f} ls {est[n].load_shift:+.0f} if "
                    f"{in_flight[n]} sl {_slots(balancer, group, n)}"
                    for n in names
                )
            )
        if balancer is not None and int(t / STEP) % 20 == 0:
            view = balancer._views.get(group)
            if view is not None:
                for n in names:
                    fit = view.loads.get(n)
                    slots = fit.slots() if fit is not None else None
                    cap = deployments[n].behaviour(t).capacity
                    key = (
                        "under"
                        if slots is not None and slots < 0.6 * cap
                        else "over"
                        if cap < 8 and (slots is None or slots > 1.6 * cap)
                        else "ok"
                    )
                    slot_stats[(n, key)] = slot_stats.get((n, key), 0) + 1
        t += STEP
        await asyncio.sleep(0)
    results.sort(key=lambda r: r.request.index)
    mean = sum(r.rate for r in results) / len(results) if results else 0.0
    return {"mean": mean, "results": results, "trace": traces, "slots": slot_stats}


def bins_table(scenario: Scenario, runs: dict[str, dict], bins: int) -> list[str]:
    """Per time bin (by arrival): mean effective rate of ours and the oracle, and each one's shares."""
    names = [spec.name for spec in scenario.deployments]
    width = scenario.workload.duration / bins
    lines = [f"    bin         ours oracle  loss | shares {'/'.join(names)} %: ours | oracle | true rates"]
    for i in range(bins):
        cells = []
        means = []
        for strategy in ("ours", "oracle"):
            inside = [r for r in runs[strategy]["results"] if i * width <= r.started < (i + 1) * width]
            means.append(sum(r.rate for r in inside) / len(inside) if inside else math.nan)
            cells.append(
                "/".join(f"{100 * sum(r.deployment == n for r in inside) / len(inside):3.0f}" for n in names)
                if inside
                else "-"
            )
        mid = (i + 0.5) * width
        rates = "/".join(f"{spec.behaviour_at(mid).rate_at(mid):.0f}" for spec in scenario.deployments)
        lines.append(
            f"    {i * width:4.1f}-{(i + 1) * width:4.1f}s {means[0]:6.1f} {means[1]:6.1f} {means[1] - means[0]:5.1f} "
            f"| {cells[0]} | {cells[1]} | {rates}"
        )
    return lines


def _slots(balancer: RateBalancer, group: str, name: str) -> str:
    view = balancer._views.get(group)
    fit = view.loads.get(name) if view is not None else None
    if fit is None:
        return "-"
    slots = fit.slots()
    return f"{slots:.1f}" if slots is not None else f"p{fit.presumed_slots():.0f}"


def _seeds(text: Sequence[str]) -> list[int]:
    out: list[int] = []
    for part in text:
        if "-" in part:
            low, high = part.split("-")
            out += list(range(int(low), int(high) + 1))
        else:
            out.append(int(part))
    return out


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", nargs="+", default=["drift", "fluctuating", "mixed-slots"])
    parser.add_argument("--seeds", nargs="+", default=["1-8"])
    parser.add_argument("--duration", type=float, default=12.0)
    parser.add_argument("--ours", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--slots", action="store_true", help="configure each deployment's true capacity")
    parser.add_argument("--trace", type=float, default=0.0, metavar="SECONDS", help="trace ours every SECONDS")
    parser.add_argument("--per-seed", action="store_true")
    parser.add_argument(
        "--limited-oracle",
        type=float,
        default=None,
        metavar="LAG",
        help="also run the oracle limited to what a learner can know: behaviour LAG seconds old, cooldowns",
    )
    parser.add_argument("--blind", action="store_true", help="the limited oracle does not know answer lengths")
    parser.add_argument("--bins", type=int, default=0, help="per seed: rates and shares per time bin")
    parser.add_argument(
        "--phases", default=None, help="comma-separated times: loss against the oracle per phase, over the seeds"
    )
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    for item in args.ours:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    if args.slots:
        overrides["__slots"] = True
    seeds = _seeds(args.seeds)
    global TRACE_EVERY, ORACLE_LAG, ORACLE_BLIND
    TRACE_EVERY = args.trace or 1.0
    ORACLE_LAG = args.limited_oracle or 0.0
    ORACLE_BLIND = args.blind
    strategies = ("ours", "least-busy", "oracle") + (("oracle-limited",) if args.limited_oracle is not None else ())
    for name in args.scenarios:
        rows = []
        limited_rows: list[float] = []
        phase_rows: list[dict[tuple[float, float], float]] = []
        slot_totals: dict[tuple[str, str], int] = {}
        for seed in seeds:
            scenario = build_scenario(name, duration=args.duration, seed=seed)
            r = {s: simulate(scenario, s, dict(overrides), trace=bool(args.trace) and s == "ours") for s in strategies}
            rows.append((seed, r["ours"]["mean"], r["least-busy"]["mean"], r["oracle"]["mean"]))
            limited_rows.append(r["oracle-limited"]["mean"] if "oracle-limited" in r else math.nan)
            for k, v in r["ours"]["slots"].items():
                slot_totals[k] = slot_totals.get(k, 0) + v
            if args.phases:
                cuts = [float(x) for x in args.phases.split(",")]
                total = len(r["ours"]["results"])
                lost = {}
                for low, high in itertools.pairwise(cuts):
                    sums = []
                    for strategy in ("ours", "oracle"):
                        sums.append(sum(x.rate for x in r[strategy]["results"] if low <= x.started < high))
                    lost[(low, high)] = (sums[1] - sums[0]) / total
                phase_rows.append(lost)
            if args.per_seed:
                print(
                    f"  {name} seed {seed}: ours {r['ours']['mean']:.1f} lb {r['least-busy']['mean']:.1f} "
                    f"oracle {r['oracle']['mean']:.1f}  ours/oracle {r['ours']['mean'] / r['oracle']['mean']:.3f} "
                    f"ours/lb {r['ours']['mean'] / r['least-busy']['mean']:.3f}"
                )
            if args.bins:
                print("\n".join(bins_table(scenario, r, args.bins)))
            if args.trace:
                print("\n".join("    " + line for line in r["ours"]["trace"]))
        if args.phases:
            cuts = [float(x) for x in args.phases.split(",")]
            parts = []
            for low, high in itertools.pairwise(cuts):
                lost = sum(p[(low, high)] for p in phase_rows) / len(phase_rows)
                parts.append(f"{low:g}-{high:g}s {lost:5.2f}")
            print("    loss per request of the run, by phase: " + "  ".join(parts))
        if slot_totals:
            names_ = sorted({k[0] for k in slot_totals})
            parts = []
            for n in names_:
                total = sum(v for k, v in slot_totals.items() if k[0] == n)
                parts.append(
                    f"{n}: under {100 * slot_totals.get((n, 'under'), 0) / total:.0f}% over "
                    f"{100 * slot_totals.get((n, 'over'), 0) / total:.0f}%"
                )
            print("    slots belief (time share): " + "; ".join(parts))
        ours_avg = statistics.mean(r[1] for r in rows)
        lb_avg = statistics.mean(r[2] for r in rows)
        oracle_avg = statistics.mean(r[3] for r in rows)
        print(
            f"{name:12s} ours {ours_avg:6.1f}  least-busy {lb_avg:6.1f}  oracle {oracle_avg:6.1f}  "
            f"ours/oracle {ours_avg / oracle_avg:.3f}  ours/lb {ours_avg / lb_avg:.3f}  "
            f"min seed ours/lb {min(r[1] / r[2] for r in rows):.3f}  min ours/oracle "
            f"{min(r[1] / r[3] for r in rows):.3f}",
            flush=True,
        )
        if args.limited_oracle is not None:
            limited_avg = statistics.mean(limited_rows)
            print(
                f"{'':12s} oracle-limited (lag {ORACLE_LAG:g}s{', blind' if ORACLE_BLIND else ''}) {limited_avg:6.1f}"
                f"  limited/oracle {limited_avg / oracle_avg:.3f}  ours/limited {ours_avg / limited_avg:.3f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
