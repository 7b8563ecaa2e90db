"""The cost part's pure policy: who a request's cost belongs to, and how much of a local GPU it used.

No I/O and no clock here: the store keeps each deployment's :class:`SharingClock` (with the Redis server's
time), the cost adapter (:mod:`litellm_ratebalance.proxy.cost`) feeds requests in and publishes metrics.
Named apart from the part because ``litellm_ratebalance.cost`` is the callback instance users list. See
docs/cost.md.
"""

from __future__ import annotations

from litellm_ratebalance.attribution.config import CostSettings, DeploymentCost
from litellm_ratebalance.attribution.labels import CostLabels, TeamLabels, cost_labels
from litellm_ratebalance.attribution.sharing import Efficiency, Mark, SharingClock, advance, decayed, gpu_share

__all__ = [
    "CostLabels",
    "CostSettings",
    "DeploymentCost",
    "Efficiency",
    "Mark",
    "SharingClock",
    "TeamLabels",
    "advance",
    "cost_labels",
    "decayed",
    "gpu_share",
]
