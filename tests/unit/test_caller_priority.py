"""Who is asking: the priority of a caller from admin-set team and key metadata (litellm_ratebalance/identity.py)."""

from __future__ import annotations

from typing import Any

import pytest
from litellm.proxy._types import UserAPIKeyAuth

from litellm_ratebalance.identity import metadata_value, resolve_priority

CONFIGURED = frozenset({"prod", "dev"})


def auth(team: dict[str, Any] | None, key: dict[str, Any] | None) -> UserAPIKeyAuth:
    return UserAPIKeyAuth(team_metadata=team, metadata=key if key is not None else {})


@pytest.mark.parametrize("unusable", [5, 0.9, ["prod"], {"name": "prod"}, "", True], ids=repr)
def test_unusable_team_priority_means_no_priority_not_the_keys(unusable: object) -> None:
    # The team's word wins over the key's even when it is unusable: the key's valid, configured priority
    # is not consulted, and the request goes to the default pool.
    caller = auth({"priority": unusable}, {"priority": "prod"})
    assert metadata_value(caller, "priority") is None
    assert resolve_priority(caller, CONFIGURED) is None


def test_unconfigured_team_priority_means_no_priority_not_the_keys() -> None:
    caller = auth({"priority": "bogus"}, {"priority": "prod"})
    assert resolve_priority(caller, CONFIGURED) is None


@pytest.mark.parametrize("team", [None, {}, {"other": "x"}], ids=repr)
def test_key_priority_applies_when_the_team_sets_none(team: dict[str, Any] | None) -> None:
    assert resolve_priority(auth(team, {"priority": "prod"}), CONFIGURED) == "prod"


def test_team_priority_wins_over_the_keys() -> None:
    assert resolve_priority(auth({"priority": "dev"}, {"priority": "prod"}), CONFIGURED) == "dev"
