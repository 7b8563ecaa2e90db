"""What routing believes about a model group, read from the store alone: no balancer, no Router, no proxy.

:func:`read_view` reads the shared statistics once (nothing is written) into a
:class:`~litellm_ratebalance.routing.view.GroupView`; :func:`view_estimates` computes from it the figures and
shares every replica starts from (:mod:`~litellm_ratebalance.routing.shares`), the ones ``status`` shows.
What only a serving replica knows (its requests in flight, its load and size fits) is not part of it, so a
replica's live shares can differ while requests are in flight there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.routing.shares import candidate_states, estimates, uniform
from litellm_ratebalance.routing.types import Candidate, DeploymentEstimate
from litellm_ratebalance.routing.view import GroupView, SyncPlan, sync

if TYPE_CHECKING:
    from litellm_ratebalance.store.routing import RoutingStore

__all__ = ["known_candidates", "read_view", "routing_status", "view_estimates"]

logger = logging.getLogger("litellm_ratebalance.routing")


async def read_view(
    store: RoutingStore,
    settings: RoutingSettings,
    model_group: str,
    *,
    clock: Callable[[], float] = time.time,
) -> GroupView:
    """The shared view of ``model_group``, read from the store (nothing is written). Raises what the store
    raises."""
    view = GroupView()
    plan = SyncPlan(settings)
    await sync(lambda: store, model_group, view, settings, plan, clock)
    if abs(view.offset) * 1000 >= plan.bucket_ms:
        # The store's clock is not this machine's: the first read asked for the wrong buckets.
        await sync(lambda: store, model_group, view, settings, plan, clock)
    return view


def known_candidates(view: GroupView) -> list[Candidate]:
    """Every deployment the view has samples, usage or requests in flight of, by id."""
    known = set(view.derived.window_full) | set(view.derived.usage) | set(view.in_flight)
    return [Candidate(d, view.ratios.get(d)) for d in sorted(known)]


def view_estimates(
    view: GroupView, settings: RoutingSettings, candidates: Sequence[Candidate] | None = None
) -> dict[str, DeploymentEstimate]:
    """Per candidate (every deployment the view knows, when None): its figures and its share among exactly
    these candidates, computed from the view with nothing in flight here."""
    chosen = known_candidates(view) if candidates is None else list(candidates)
    if not chosen:
        return {}
    shares = uniform(len(chosen)) if settings.round_robin else candidate_states(view, settings, chosen).shares
    return estimates(view, settings, chosen, shares)


async def routing_status(
    store: RoutingStore,
    settings: RoutingSettings,
    model_group: str,
    deployments: Sequence[str | Candidate],
) -> list[DeploymentEstimate]:
    """What routing currently believes about ``deployments`` of ``model_group``, read from the store alone.

    For the ``status`` command and dashboards. One read of the shared statistics (nothing is written), then
    per deployment, in the order given: estimated rate (``mean_rate``, ``std_rate``, recency-weighted as
    routing uses them), ``samples``, failures, and ``share``, the choice probability among exactly these
    deployments computed as routing computes it from the shared view (rate-limit headers included;
    configured tpm / rpm only when passed as :class:`Candidate`). A store error is logged and the figures
    are those of an empty view.
    """
    try:
        view = await read_view(store, settings, model_group)
    except Exception as exc:
        logger.warning("litellm_ratebalance routing: reading routing statistics failed: %s", exc)
        view = GroupView()
    candidates = [d if isinstance(d, Candidate) else Candidate(str(d)) for d in deployments]
    rows = view_estimates(view, settings, candidates)
    return [rows[c.id] for c in candidates]
