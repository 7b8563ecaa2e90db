"""``general_settings.custom_auth`` for fault tests of LiteLLM's own limiter: every key carries ``rpm_limit``.

The proxy's master key (``RATEBALANCE_E2E_MASTER_KEY``, set by the harness) is the admin; any other bearer
token is a key with ``rpm_limit`` = ``RATEBALANCE_FAULTS_RPM_LIMIT``, which LiteLLM's
``parallel_request_limiter_v3`` enforces per key across replicas through the proxy's Redis. Copied next to
the proxy's config.yaml and loaded by LiteLLM from there: keep it self-contained.
"""

from __future__ import annotations

import os

from fastapi import Request
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

_MASTER_KEY = os.environ.get("RATEBALANCE_E2E_MASTER_KEY")
_RPM_LIMIT = int(os.environ.get("RATEBALANCE_FAULTS_RPM_LIMIT", "0")) or None


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    if _MASTER_KEY and api_key == _MASTER_KEY:
        return UserAPIKeyAuth(api_key=api_key, user_role=LitellmUserRoles.PROXY_ADMIN)
    return UserAPIKeyAuth(api_key=api_key, key_alias=api_key, user_id=f"user-{api_key}", rpm_limit=_RPM_LIMIT)
