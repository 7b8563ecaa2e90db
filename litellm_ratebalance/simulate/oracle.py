"""An oracle routing strategy for the benchmark: it reads the deployments' *true* behaviour.

It knows every mock deployment's spec (so its true token rate, base latency, capacity, failure
probabilities, 429 bursts and stall windows at any moment) and counts its own requests in flight per
deployment (it is the only client in a benchmark run). For each request it picks the deployment with the
highest expected effective token rate ``(output + input / ratio) / latency`` times the probability that the
request succeeds there, where the latency assumes the deployment's current in-flight count plus this request
shares its capacity. It is greedy (it does not plan ahead or weigh how a pick slows the requests already
there) and knows nothing of per-request jitter: a strong reference, not a proven optimum.

With ``lag_seconds`` it sees each deployment's behaviour as it was that long ago: a reference for how much of
the gap to the oracle is the time any learner needs before answers can show a change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from litellm.types.router import CustomRoutingStrategyBase

from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.simulate.mock_openai import (
    Behaviour,
    DeploymentSpec,
    UsageWindow,
    answer_length,
    estimate_prompt_tokens,
)

__all__ = ["OracleRouting", "expected_effective_rate"]

MOCK_NAME_KEY = "mock_deployment"
"""``model_info`` key naming the mock deployment a router deployment points at."""


def expected_effective_rate(
    behaviour: Behaviour,
    elapsed: float,
    in_flight: int,
    prompt_tokens: int,
    output_tokens: int,
    ratio: float,
    budget_left: bool = True,
) -> float:
    """Expected effective token rate of one more request on a deployment behaving as ``behaviour`` at
    ``elapsed`` with ``in_flight`` requests already there; 0 where it would be refused (429 burst, spent budget).
    Failures (5xx, stalls) count as rate 0, so the result is scaled by the probability of success."""
    if behaviour.rate_limited or not budget_left:
        return 0.0
    success = (1.0 - behaviour.error_rate) * (1.0 - behaviour.stall_rate)
    if success <= 0:
        return 0.0
    share = 1.0 if behaviour.overload == "queue" else min(1.0, behaviour.capacity / (in_flight + 1))
    if behaviour.overload == "queue" and in_flight >= behaviour.capacity:
        # Waiting for a slot: about as long as the requests ahead take, spread over the slots.
        share = behaviour.capacity / (in_flight + 1)
    latency = (
        behaviour.base_latency
        + prompt_tokens / (behaviour.prefill_rate * share)
        + output_tokens / (behaviour.rate_at(elapsed) * share)
    )
    return success * (output_tokens + prompt_tokens / ratio) / latency


class OracleRouting(CustomRoutingStrategyBase):  # type: ignore[misc]
    """Install with ``router.register_plugin(OracleRouting(router, specs, epoch))`` (LiteLLM 1.110+;
    ``set_custom_routing_strategy`` before it: :func:`~litellm_ratebalance.proxy._litellm.set_routing_strategy`
    takes either).

    Router deployments name their mock with ``model_info["mock_deployment"]``. The load driver calls
    :meth:`finished` with the ``metadata["bench_request_id"]`` it sent once a request is over (success or
    failure), which keeps the in-flight counts exact and immediate. Cooldowns are not consulted: the oracle
    knows better.
    """

    def __init__(
        self,
        router: Any,
        specs: Mapping[str, DeploymentSpec],
        epoch: float,
        *,
        ratio: float = 250.0,
        clock: Callable[[], float] = time.time,
        lag_seconds: float = 0.0,
    ) -> None:
        if lag_seconds < 0:
            raise ValueError(f"lag_seconds must be >= 0 (got {lag_seconds})")
        self._lag = lag_seconds
        self._router = router
        self._specs = dict(specs)
        self._epoch = epoch
        self._ratio = ratio
        self._clock = clock
        self._in_flight: dict[str, int] = dict.fromkeys(self._specs, 0)
        self._usage = {name: UsageWindow() for name in self._specs}
        self._picked: dict[str, str] = {}

    def in_flight(self) -> dict[str, int]:
        return dict(self._in_flight)

    def finished(self, request_id: str) -> None:
        """A request the oracle routed is over."""
        name = self._picked.pop(request_id, None)
        if name is not None:
            self._in_flight[name] -= 1

    def choose(self, deployments: list[dict[str, Any]], prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
        """The deployment with the highest expected effective rate now, as of ``lag_seconds`` ago (the first on
        ties)."""
        elapsed = self._clock() - self._epoch
        best: dict[str, Any] | None = None
        best_score = -1.0
        for deployment in deployments:
            name = deployment.get("model_info", {}).get(MOCK_NAME_KEY)
            spec = self._specs.get(name) if isinstance(name, str) else None
            if spec is None:
                continue
            assert isinstance(name, str)
            seen = max(0.0, elapsed - self._lag)
            behaviour = spec.behaviour_at(seen)
            budget_left = True
            if behaviour.tpm is not None or behaviour.rpm is not None:
                requests, tokens = self._usage[name].usage(elapsed, behaviour.limit_window)
                budget_left = (behaviour.rpm is None or requests + 1 <= behaviour.rpm) and (
                    behaviour.tpm is None or tokens + prompt_tokens + output_tokens <= behaviour.tpm
                )
            score = expected_effective_rate(
                behaviour, seen, self._in_flight[name], prompt_tokens, output_tokens, self._ratio, budget_left
            )
            if score > best_score:
                best, best_score = deployment, score
        if best is None:
            raise ValueError("no deployment of this model group names a known mock deployment")
        return best

    def _pick(self, model: str, messages: Any, request_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        kwargs = request_kwargs or {}
        deployments = [
            d for d in _litellm.router_deployments(self._router) if isinstance(d, dict) and d.get("model_name") == model
        ]
        prompt_tokens = estimate_prompt_tokens(messages)
        # The oracle knows the answer's true length (the prompt's tag, as the mock reads it).
        output_tokens, _ = answer_length(messages, kwargs.get("max_tokens"), 64)
        chosen = self.choose(deployments, prompt_tokens, output_tokens)
        name = chosen["model_info"][MOCK_NAME_KEY]
        self._in_flight[name] += 1
        elapsed = self._clock() - self._epoch
        self._usage[name].charge(elapsed, prompt_tokens + output_tokens)
        request_id = (kwargs.get("metadata") or {}).get("bench_request_id")
        if request_id is not None:
            self._picked[str(request_id)] = name
        return chosen

    async def async_get_available_deployment(  # type: ignore[override]
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: str | list[Any] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return self._pick(model, messages, request_kwargs)

    def get_available_deployment(  # type: ignore[override]
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: str | list[Any] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return self._pick(model, messages, request_kwargs)
