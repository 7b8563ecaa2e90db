"""Simulation kit: mock OpenAI-compatible deployments with known behaviour, seeded scenarios, an oracle
routing strategy that reads the true behaviour, and a load driver that measures effective token rates.

The benchmark (``bench/bench_routing.py``) and the demo share it.
"""

from __future__ import annotations

from litellm_ratebalance.simulate.mock_openai import (
    Behaviour,
    Change,
    DeploymentSpec,
    MockCluster,
    MockClusterProcess,
    MockDeployment,
    ServedRequest,
    behaviour_at,
)

__all__ = [
    "Behaviour",
    "Change",
    "DeploymentSpec",
    "MockCluster",
    "MockClusterProcess",
    "MockDeployment",
    "ServedRequest",
    "behaviour_at",
]
