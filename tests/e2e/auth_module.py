"""``general_settings.custom_auth`` for end-to-end tests: bearer tokens -> ``UserAPIKeyAuth`` without a database.

The harness copies this file next to the proxy's config.yaml (LiteLLM loads ``custom_auth: auth_module.fn``
from ``<config dir>/auth_module.py`` before trying an import), so it must not import anything from
``tests``. LiteLLM executes the file on its own: keep it self-contained.

Tokens: :data:`DEFAULT_KEYS` below, plus those a test adds through the ``RATEBALANCE_E2E_KEYS``
environment variable (JSON ``{token: {"metadata": {...}, "team_metadata": {...}, "team_id": ..., ...}}``,
set by the harness from ``LiteLLMProxy(keys=...)``). The proxy's master key (``RATEBALANCE_E2E_MASTER_KEY``)
authenticates as proxy admin. Any other token gets a 401.
"""

from __future__ import annotations

import json
import os
from typing import Any

from fastapi import HTTPException, Request
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

DEFAULT_KEYS: dict[str, dict[str, Any]] = {
    # Team priority prod (team metadata wins over key metadata).
    "sk-prod-1": {"team_id": "team-prod", "team_metadata": {"priority": "prod"}, "metadata": {}},
    "sk-prod-2": {"team_id": "team-prod", "team_metadata": {"priority": "prod"}, "metadata": {}},
    # Key priority dev, no team.
    "sk-dev-1": {"metadata": {"priority": "dev"}},
    "sk-dev-2": {"metadata": {"priority": "dev"}},
    # Key says dev, its team says prod: the team's word wins.
    "sk-devkey-prodteam": {
        "team_id": "team-prod",
        "team_metadata": {"priority": "prod"},
        "metadata": {"priority": "dev"},
    },
    # No priority anywhere: the shared default pool.
    "sk-none": {"metadata": {}},
    # A priority that is not configured: also the default pool.
    "sk-unknown-priority": {"metadata": {"priority": "platinum"}},
}


def _keys() -> dict[str, dict[str, Any]]:
    keys = dict(DEFAULT_KEYS)
    extra = os.environ.get("RATEBALANCE_E2E_KEYS")
    if extra:
        keys.update(json.loads(extra))
    return keys


_KEYS = _keys()
_MASTER_KEY = os.environ.get("RATEBALANCE_E2E_MASTER_KEY")


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    """LiteLLM's custom-auth signature: return the caller's identity or raise (401)."""
    if _MASTER_KEY and api_key == _MASTER_KEY:
        return UserAPIKeyAuth(api_key=api_key, user_role=LitellmUserRoles.PROXY_ADMIN)
    spec = _KEYS.get(api_key)
    if spec is None:
        raise HTTPException(status_code=401, detail={"error": "unknown test key"})
    return UserAPIKeyAuth(
        api_key=api_key,
        key_alias=api_key,
        user_id=spec.get("user_id", f"user-{api_key}"),
        team_id=spec.get("team_id"),
        metadata=dict(spec.get("metadata") or {}),
        team_metadata=dict(spec["team_metadata"]) if spec.get("team_metadata") is not None else None,
    )
