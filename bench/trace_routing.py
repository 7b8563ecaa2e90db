"""Where a routing strategy loses against the oracle: read a ``bench_routing.py --dump`` file and print, per
scenario and seed, the loss by phase of the run, the share each deployment got over time next to the oracle's,
and how fast the shares followed a change of which deployment is fastest.

Usage::

    python bench/bench_routing.py --scenarios drift --seeds 1 2 3 --duration 12 --no-proxy \\
        --strategies ours least-busy oracle --dump /tmp/drift.pkl
    python bench/trace_routing.py /tmp/drift.pkl [--scenario drift] [--strategy ours] [--bins 12]

Per seed it prints:

* mean effective rate of the requests arriving in each time bin, the strategy's and the oracle's (a failure
  counts 0), and the share of those requests each deployment received, both ways;
* ``fastest share``: the share of requests sent to the deployment that was truly fastest (one request alone)
  when they arrived, and to the slowest;
* for each moment the fastest deployment changes (a timeline event or a wave crossing): how long until the
  strategy sent a third of its requests there (``notice``, over a sliding window of 10 requests), and the
  peak share it gave the new fastest in the following bins against the oracle's (over- or under-shoot).
"""

from __future__ import annotations

import argparse
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from litellm_ratebalance.simulate.load import effective_rate
from litellm_ratebalance.simulate.scenarios import build_scenario

RATIO = 250.0


def _by_request(run: Any) -> list[tuple[float, str, float]]:
    """(arrival, deployment, effective rate) per request of a run, in arrival order."""
    where = {r.request_id: r.deployment for r in run.served if r.request_id is not None}
    out = []
    for result in run.results:
        name = where.get(str(result.index))
        if name is None:
            continue
        out.append((result.started, name, effective_rate(result, RATIO)))
    out.sort()
    return out


def _true_rates(scenario: Any, at: float) -> dict[str, float]:
    return {spec.name: spec.behaviour_at(at).rate_at(at) for spec in scenario.deployments}


def _leader_changes(scenario: Any, duration: float, step: float = 0.05) -> list[tuple[float, str]]:
    changes: list[tuple[float, str]] = []
    t = 0.0
    while t < duration:
        rates = _true_rates(scenario, t)
        best = max(rates, key=lambda n: rates[n])
        if not changes or changes[-1][1] != best:
            changes.append((round(t, 2), best))
        t += step
    return changes


def trace(scenario: Any, ours: Any, oracle: Any, bins: int, duration: float) -> list[str]:
    names = [spec.name for spec in scenario.deployments]
    width = duration / bins
    lines: list[str] = []
    mine = _by_request(ours)
    best = _by_request(oracle) if oracle is not None else []

    def binned(requests: Sequence[tuple[float, str, float]]) -> list[tuple[float, dict[str, int], int]]:
        out = []
        for i in range(bins):
            inside = [r for r in requests if i * width <= r[0] < (i + 1) * width]
            counts = {n: sum(1 for r in inside if r[1] == n) for n in names}
            mean = sum(r[2] for r in inside) / len(inside) if inside else float("nan")
            out.append((mean, counts, len(inside)))
        return out

    a, b = binned(mine), binned(best)
    lines.append(f"    bin        {ours.strategy:>7} oracle   loss | shares {'/'.join(names)} %: ours | oracle")
    for i in range(bins):
        (ma, ca, na), (mb, cb, nb) = a[i], b[i]
        sa = "/".join(f"{100 * ca[n] / na:3.0f}" if na else "  -" for n in names)
        sb = "/".join(f"{100 * cb[n] / nb:3.0f}" if nb else "  -" for n in names)
        lines.append(f"    {i * width:4.1f}-{(i + 1) * width:4.1f}s {ma:7.1f} {mb:6.1f} {mb - ma:6.1f} | {sa} | {sb}")
    for label, requests in ((ours.strategy, mine), ("oracle", best)):
        if not requests:
            continue
        fastest = slowest = 0
        for at, name, _ in requests:
            rates = _true_rates(scenario, at)
            fastest += name == max(rates, key=lambda n: rates[n])
            slowest += name == min(rates, key=lambda n: rates[n])
        lines.append(
            f"    {label}: to the truly fastest {100 * fastest / len(requests):.0f} %, "
            f"to the slowest {100 * slowest / len(requests):.0f} %"
        )
    changes = _leader_changes(scenario, duration)
    for at, leader in changes[1:]:
        parts = []
        for label, requests in ((ours.strategy, mine), ("oracle", best)):
            after = [r for r in requests if r[0] >= at]
            notice = None
            for k in range(len(after) - 9):
                window = after[k : k + 10]
                if sum(1 for r in window if r[1] == leader) >= 4:
                    notice = window[-1][0] - at
                    break
            span = [r for r in after if r[0] < at + 3.0]
            share = sum(1 for r in span if r[1] == leader) / len(span) if span else float("nan")
            parts.append(
                f"{label} notice {'never' if notice is None else f'{notice:.1f} s'}, "
                f"share in the next 3 s {100 * share:.0f} %"
            )
        lines.append(f"    t={at:4.1f}s {leader} becomes fastest: " + "; ".join(parts))
    return lines


class _BenchUnpickler(pickle.Unpickler):
    """Reads a dump written by ``bench_routing.py`` run as a script, whose record classes were pickled as
    ``__main__``'s: they are looked up in that module instead."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "__main__":
            import bench_routing

            return getattr(bench_routing, name)
        return super().find_class(module, name)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump")
    parser.add_argument("--scenario", action="append", default=None)
    parser.add_argument("--strategy", default="ours")
    parser.add_argument("--bins", type=int, default=12)
    parser.add_argument("--seeds", type=int, nargs="*", default=None)
    args = parser.parse_args(argv)
    with Path(args.dump).open("rb") as dump:
        data = _BenchUnpickler(dump).load()
    duration = data["duration"]
    for seed, runs_by in data["by_seed"].items():
        if args.seeds and seed not in args.seeds:
            continue
        for name, runs in runs_by.items():
            if args.scenario and name not in args.scenario:
                continue
            by = {r.strategy: r for r in runs}
            if args.strategy not in by:
                continue
            ours = by[args.strategy]
            oracle = by.get("oracle")
            scenario = build_scenario(name, duration=duration, seed=seed)
            ratio = ours.summary.mean_rate / oracle.summary.mean_rate if oracle else float("nan")
            extra = " ".join(
                f"{s} {r.summary.mean_rate:.1f}" for s, r in by.items() if s not in (args.strategy, "oracle")
            )
            print(
                f"== {name} seed {seed}: {args.strategy} {ours.summary.mean_rate:.1f}, oracle "
                f"{oracle.summary.mean_rate if oracle else float('nan'):.1f} ({ratio:.2f}x), {extra}"
            )
            print("\n".join(trace(scenario, ours, oracle, args.bins, duration)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
