"""What the rate balancer reads from LiteLLM's dicts: deployments as candidates, a request's size and id, a
finished call's sample.

* :func:`deployment_candidates` / :func:`pool`: deployment dicts -> :class:`~litellm_ratebalance.routing.Candidate`
  values (``model_info.id``, ``input_to_output_ratio``, ``slots``; ``tpm`` / ``rpm``), read once per dict and
  per set of dicts (the Router hands the same dicts on every request);
* :func:`request_work`, :func:`request_id_of`: a request's size from its output-token limit and prompt, and its
  id (LiteLLM's ``litellm_trace_id``), the same in the routing hook and in the logging events;
* :func:`record_call`, :func:`finish_call`: a finished call's sample (rate, failure, TTFT, ``x-ratelimit-*``
  headers) from LiteLLM's logging ``kwargs``, and an answer's end from its post-call hook's data.

Nothing here picks: :mod:`.callback` holds the callback and the SDK strategy.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.tokens import message_text_chars, requested_output_tokens
from litellm_ratebalance.routing.balancer import RateBalancer
from litellm_ratebalance.routing.model_info import model_info_problems, read_candidate, read_candidates
from litellm_ratebalance.routing.model_info import non_negative as _non_negative
from litellm_ratebalance.routing.model_info import positive as _positive
from litellm_ratebalance.routing.records import RateLimitObservation, parse_reset_seconds
from litellm_ratebalance.routing.types import Candidate

__all__ = [
    "Pool",
    "deployment_candidates",
    "finish_call",
    "model_group_of",
    "pool",
    "record_call",
    "request_id_of",
    "request_work",
]

logger = logging.getLogger("litellm_ratebalance.routing")

_REQUEST_FAULT_CODES = frozenset({400, 413, 422})
"""Failures that say nothing about the deployment (bad request, too large, unprocessable)."""


_candidate_cache: dict[int, tuple[Mapping[str, Any], Candidate]] = {}
_CANDIDATE_CACHE_SIZE = 4096


def _candidate(deployment: Mapping[str, Any]) -> Candidate | None:
    # The Router hands the same deployment dicts on every request: read each one once. The cache holds the
    # dict itself, so its id cannot be reused by another object while the entry exists.
    key = id(deployment)
    cached = _candidate_cache.get(key)
    if cached is not None and cached[0] is deployment:
        return cached[1]
    candidate = read_candidate(deployment)
    if candidate is None:
        return None
    for problem in model_info_problems([deployment]):
        logger.warning("litellm_ratebalance routing: %s", problem)  # once per deployment dict (cached below)
    if len(_candidate_cache) >= _CANDIDATE_CACHE_SIZE:
        _candidate_cache.clear()  # the Router replaced its model list (or many routers): start over
    _candidate_cache[key] = (deployment, candidate)
    return candidate


def deployment_candidates(deployments: Sequence[Mapping[str, Any]]) -> tuple[Candidate, ...] | None:
    """The balancer's view of LiteLLM deployment dicts (None when one lacks a ``model_info.id``):
    :func:`~litellm_ratebalance.routing.model_info.read_candidates`, but a dict is read once and remembered (the
    Router passes the same dicts each time and builds new ones when its model list changes), and a bad value
    in its ``model_info`` is logged as a warning when it is first read.
    """
    return read_candidates(deployments, _candidate)


class Pool(NamedTuple):
    """What the filter hook needs to know of one list of deployment dicts, read once per set of dicts."""

    deployments: tuple[Any, ...]
    """The dicts themselves: held, so that no other object can take one of their ids while the entry exists."""
    mappings: bool
    """Every one is a mapping (else the hook leaves the list to the Router)."""
    ordered: bool
    """One of them sets ``litellm_params.order`` (the Router narrows by it after the hook)."""
    candidates: tuple[Candidate, ...] | None
    """:func:`deployment_candidates` of them (None: one lacks an id, or one is not a mapping)."""


_pool_cache: dict[tuple[int, ...], Pool] = {}
_POOL_CACHE_SIZE = 1024


def pool(deployments: Sequence[Any]) -> Pool:
    """What the filter hook needs to know of these deployments (:class:`Pool`), read once per set of dicts.

    Assumes, as :func:`_candidate` does, that the Router does not edit a deployment dict in place: its
    ``upsert_deployment`` replaces the dict (tests/integration/test_routing_router.py checks it)."""
    # The Router builds a new list of healthy deployments for every request, of the same dicts while its
    # model list stands (a cooldown leaves a subset of them): the dicts' ids name the set. One lookup on
    # the request path instead of a pass over the dicts for each of the three facts.
    key = tuple(map(id, deployments))
    pool = _pool_cache.get(key)
    if pool is None:
        held = tuple(deployments)
        # (type() first: the Router's dicts are plain, and an ABC isinstance costs more than the pick)
        mappings = all(type(d) is dict or isinstance(d, Mapping) for d in held)
        pool = Pool(
            held,
            mappings,
            mappings and _litellm.any_order(held),
            deployment_candidates(held) if mappings else None,
        )
        if len(_pool_cache) >= _POOL_CACHE_SIZE:
            _pool_cache.clear()  # a changed model list (or many cooldown subsets): start over
        _pool_cache[key] = pool
    return pool


def model_group_of(deployments: Sequence[Mapping[str, Any]], model: str) -> str:
    name = deployments[0].get("model_name")
    return name if isinstance(name, str) and name else model


def request_id_of(kwargs: Mapping[str, Any] | None) -> str | None:
    """LiteLLM's id of one request, the same in the routing hook and in its logging events."""
    value = kwargs.get("litellm_trace_id") if kwargs else None
    return value if isinstance(value, str) and value else None


_NO_CEILING = 2**62
_CHARS_PER_TOKEN = 4.0
"""Characters of prompt text per input token, for a request's size before it is tokenized (OpenAI's rule of
thumb; the input part of a request's work is divided by the input-to-output ratio, so the error is small)."""


def request_work(messages: object, request_kwargs: Mapping[str, Any] | None, ratio: float) -> float | None:
    """The most a request can cost in work tokens, ``max_tokens + input_tokens / ratio``: its output-token
    limit as the admission reservation reads it (:func:`requested_output_tokens`), the input counted from the
    characters of its messages' text; None when it sets no positive limit, since its output length is then
    unknown."""
    if not request_kwargs:
        return None
    cap = requested_output_tokens(request_kwargs, default=0, ceiling=_NO_CEILING)
    if cap <= 0:
        return None
    return cap + message_text_chars(messages) / _CHARS_PER_TOKEN / ratio


def _rate_limits(headers: object) -> RateLimitObservation | None:
    if not isinstance(headers, Mapping):
        return None

    def header(name: str) -> float | None:
        return _non_negative(headers.get(f"x_ratelimit_{name}"))

    observation = RateLimitObservation(
        remaining_requests=header("remaining_requests"),
        remaining_tokens=header("remaining_tokens"),
        limit_requests=header("limit_requests"),
        limit_tokens=header("limit_tokens"),
    )
    if observation.remaining_requests is None and observation.remaining_tokens is None:
        return None  # limits alone say nothing about what is left
    resets = [parse_reset_seconds(headers.get(f"x_ratelimit_reset_{kind}")) for kind in ("requests", "tokens")]
    known = [r for r in resets if r is not None]
    return dataclasses.replace(observation, reset_seconds=min(known)) if known else observation


def _trace_id(payload: Mapping[str, Any]) -> str | None:
    value = payload.get("trace_id")
    return value if isinstance(value, str) and value else None


def _status_code(kwargs: Mapping[str, Any], payload: Mapping[str, Any]) -> int | None:
    info = payload.get("error_information")
    code: object = info.get("error_code") if isinstance(info, Mapping) else None
    if code in (None, ""):
        code = getattr(kwargs.get("exception"), "status_code", None)
    try:
        return int(str(code))
    except ValueError:
        return None


def finish_call(balancer: RateBalancer, request_data: Mapping[str, Any]) -> bool:
    """Tell the balancer that a call's answer is back, from the ``request_data`` of LiteLLM's
    ``async_post_call_success_deployment_hook`` (called as the answer arrives, before the caller gets it;
    the success is logged later, in the background). False when ``end_pick_on_answer`` is off (checked
    first: the hook runs for every successful call, and nothing is parsed for it then), when the call cannot
    be matched to a pick, or when it is a stream (measured when it completes)."""
    if not balancer.settings.end_pick_on_answer or request_data.get("stream"):
        return False
    info = _litellm.request_deployment_info(request_data)
    model_group = _litellm.request_metadata(request_data).get("model_group")
    request_id = request_id_of(request_data)
    if info is None or not isinstance(model_group, str) or not model_group or request_id is None:
        return False
    balancer.finish(model_group, str(info["id"]), request_id)
    return True


def record_call(balancer: RateBalancer, kwargs: Mapping[str, Any], ok: bool) -> bool:
    """Record one finished call from LiteLLM's logging ``kwargs``; False when it is not a sample."""
    payload = kwargs.get("standard_logging_object")
    if not isinstance(payload, Mapping) or payload.get("cache_hit"):
        return False
    params = kwargs.get("litellm_params") or {}
    info = params.get("model_info") if isinstance(params, Mapping) else None
    info = info if isinstance(info, Mapping) else {}
    deployment_id = payload.get("model_id") or info.get("id")
    model_group = payload.get("model_group")
    if not deployment_id or not isinstance(model_group, str) or not model_group:
        return False
    if not ok and _status_code(kwargs, payload) in _REQUEST_FAULT_CODES:
        # The request was at fault: the deployment's request slot is free again, nothing else to learn.
        balancer.release(model_group, str(deployment_id), request_id_of(kwargs) or _trace_id(payload))
        return False
    start = _non_negative(payload.get("startTime"))
    end = _non_negative(payload.get("endTime"))
    latency = end - start if start is not None and end is not None and end >= start else 0.0
    ttft = None
    first_token = _non_negative(payload.get("completionStartTime"))
    if payload.get("stream") and ok and start is not None and first_token is not None and first_token >= start:
        ttft = first_token - start
    hidden = payload.get("hidden_params")
    headers = hidden.get("additional_headers") if isinstance(hidden, Mapping) else None
    balancer.record(
        model_group,
        str(deployment_id),
        latency=latency,
        input_tokens=int(_non_negative(payload.get("prompt_tokens")) or 0) if ok else 0,
        output_tokens=int(_non_negative(payload.get("completion_tokens")) or 0) if ok else 0,
        ok=ok,
        ttft=ttft,
        input_to_output_ratio=_positive(info.get("input_to_output_ratio")),
        rate_limits=_rate_limits(headers) if ok else None,
        request_id=request_id_of(kwargs) or _trace_id(payload),
    )
    return True
