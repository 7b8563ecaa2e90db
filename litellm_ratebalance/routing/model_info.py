"""The rate balancer's per-deployment settings in a LiteLLM ``model_list``, read and checked without LiteLLM.

``model_info.id`` names a deployment (routing statistics, metrics and headers use it);
``model_info.input_to_output_ratio`` (a number > 0) and ``model_info.slots`` (a number >= 1) tune its
estimate; ``litellm_params.tpm`` / ``rpm`` (or the same at the deployment's top level, where LiteLLM also
accepts them) its capacity. :func:`read_candidate` turns one deployment dict into the core's
:class:`~litellm_ratebalance.routing.types.Candidate`. A bad value is never an error at decision time: the
reader returns ``None`` and the balancer falls back (the group's ratio, learnt slots), so a typo never fails
a request. :func:`model_info_problems` names such values for the proxy's start-up check, the SDK's
``install()`` and ``litellm-ratebalance check-config``; that last one, and ``status``, must not import LiteLLM
(seconds of import, and a network fetch of its cost map unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set), hence
this module apart from the adapters in :mod:`litellm_ratebalance.proxy.routing`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from litellm_ratebalance.routing.types import Candidate

__all__ = [
    "deployment_id",
    "model_info_problems",
    "non_negative",
    "positive",
    "read_candidate",
    "read_candidates",
    "slots",
]


def _finite(value: object) -> float | None:
    """``value`` as a finite number (a number or a numeric string; never a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def positive(value: object) -> float | None:
    """``value`` as a finite number greater than 0 (a number or a numeric string; never a bool), else None."""
    number = _finite(value)
    return number if number is not None and number > 0 else None


def non_negative(value: object) -> float | None:
    """``value`` as a finite number of at least 0 (a number or a numeric string; never a bool), else None."""
    number = _finite(value)
    return number if number is not None and number >= 0 else None


def slots(value: object) -> float | None:
    """``model_info.slots`` as a number of at least 1, else None."""
    # Like model_info.input_to_output_ratio, a value that is not a number of at least 1 is not used (the
    # deployment's slots are then learnt), so a typo in model_info never fails a request.
    number = positive(value)
    return number if number is not None and number >= 1.0 else None


def deployment_id(deployment: Mapping[str, Any]) -> str | None:
    """A deployment dict's ``model_info.id`` as a string (None when it has none)."""
    info = deployment.get("model_info")
    value = info.get("id") if type(info) is dict or isinstance(info, Mapping) else None
    return str(value) if value is not None else None


def read_candidate(deployment: Mapping[str, Any]) -> Candidate | None:
    """The balancer's view of one deployment dict (None when it has no ``model_info.id``): the ratio from
    ``model_info.input_to_output_ratio``, the slots from ``model_info.slots``, tpm / rpm from ``litellm_params``
    (or the deployment's top level)."""
    identifier = deployment_id(deployment)
    if identifier is None:
        return None
    info = deployment.get("model_info") or {}
    params = deployment.get("litellm_params") or {}
    return Candidate(
        identifier,
        positive(info.get("input_to_output_ratio")),
        positive(params.get("tpm", deployment.get("tpm"))),
        positive(params.get("rpm", deployment.get("rpm"))),
        slots(info.get("slots")),
    )


def read_candidates(
    deployments: Sequence[Mapping[str, Any]],
    read: Callable[[Mapping[str, Any]], Candidate | None] = read_candidate,
) -> tuple[Candidate, ...] | None:
    """``read`` (:func:`read_candidate` unless given) of each deployment; None when one lacks a
    ``model_info.id``."""
    out: list[Candidate] = []
    for deployment in deployments:
        candidate = read(deployment)
        if candidate is None:
            return None
        out.append(candidate)
    return tuple(out)


def model_info_problems(deployments: Sequence[Mapping[str, Any]], *, consequence: bool = True) -> list[str]:
    """What is wrong with the rate balancer's per-deployment settings in a model list, one message per bad
    value naming the deployment, the key and the valid range (empty: all usable). A bad value is ignored
    at decision time (the group's ratio, learnt slots), so a typo never fails a request; ``consequence``
    adds that to each message (for the warnings; not where the model list is refused)."""
    problems: list[str] = []
    for deployment in deployments:
        info = deployment.get("model_info")
        if not isinstance(info, Mapping):
            continue
        name = deployment_id(deployment) or deployment.get("model_name") or "?"
        model_name = deployment.get("model_name")
        if isinstance(model_name, str) and model_name and model_name != name:
            name = f"{name} (model_name {model_name})"
        ratio = info.get("input_to_output_ratio")
        if ratio is not None and positive(ratio) is None:
            problems.append(
                f"deployment {name}: model_info.input_to_output_ratio={ratio!r} must be a number greater than 0"
                + (" (ignored: the group's ratio is used)" if consequence else "")
            )
        value = info.get("slots")
        if value is not None and slots(value) is None:
            problems.append(
                f"deployment {name}: model_info.slots={value!r} must be a number of at least 1"
                + (" (ignored: the slots are learnt)" if consequence else "")
            )
    return problems
