"""Who pays: the priority, team and feature labels of a request, bounded so series cannot grow with traffic.

* **priority**: a configured priority (``priority_reservation`` keys and backpressure tiers) from team
  metadata, else key metadata; anything else is ``default`` (:func:`~litellm_ratebalance.identity.resolve_priority`,
  the resolution admission and backpressure use).
* **team**: the team's alias, else its id (set by an admin on the key, never by the request body); ``none``
  without a team. Bounded by :class:`TeamLabels`: a configured list, else the first ``max_teams`` seen by this
  process; past the bound, ``other``.
* **feature**: a configured traffic-contract feature, resolved by the caller with the contracts' own rules;
  ``unassigned`` otherwise.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from litellm_ratebalance.identity import resolve_priority

__all__ = ["DEFAULT_PRIORITY", "NO_TEAM", "OTHER_TEAM", "CostLabels", "TeamLabels", "cost_labels"]

DEFAULT_PRIORITY = "default"
NO_TEAM = "none"
OTHER_TEAM = "other"


@dataclass(frozen=True, slots=True)
class CostLabels:
    priority: str
    team: str
    feature: str


class TeamLabels:
    """Maps team names to label values, never more than a fixed number of distinct ones.

    ``allowed``: the only names that keep their own value. Without it, the first ``max_teams`` distinct names
    keep theirs (for the life of this object) and later ones become ``other``.
    """

    __slots__ = ("_allowed", "_max", "_seen")

    def __init__(self, allowed: Collection[str] | None, max_teams: int) -> None:
        self._allowed = frozenset(allowed) if allowed is not None else None
        self._max = max_teams
        self._seen: set[str] = set()

    def label(self, team: str | None) -> str:
        if not team:
            return NO_TEAM
        if self._allowed is not None:
            return team if team in self._allowed else OTHER_TEAM
        if team in self._seen:
            return team
        if len(self._seen) < self._max and team not in (NO_TEAM, OTHER_TEAM):
            self._seen.add(team)
            return team
        return OTHER_TEAM

    @property
    def overflowed(self) -> bool:
        """Whether the first-seen bound is reached (later new teams are labelled ``other``)."""
        return self._allowed is None and len(self._seen) >= self._max


def team_name(auth: Any) -> str | None:
    """The team of a ``UserAPIKeyAuth``-like object: ``team_alias``, else ``team_id``; ``None`` without one."""
    for attribute in ("team_alias", "team_id"):
        value = getattr(auth, attribute, None)
        if isinstance(value, str) and value:
            return value
    return None


def cost_labels(auth: Any, priorities: Collection[str], teams: TeamLabels, feature: str) -> CostLabels:
    """The labels of a request from its caller's ``UserAPIKeyAuth`` (``None`` or anything without those
    attributes: ``default`` / ``none``), the configured ``priorities`` and its already-resolved ``feature``."""
    return CostLabels(
        priority=resolve_priority(auth, priorities) or DEFAULT_PRIORITY,
        team=teams.label(team_name(auth)),
        feature=feature,
    )
