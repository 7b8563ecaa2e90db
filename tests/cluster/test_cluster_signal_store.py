"""tests/store/test_signal_store.py, unchanged, on the local Redis Cluster (see tests/cluster/suites.py): a
deployment's signal report is one key on its lease hash tag."""

from __future__ import annotations

import pytest

from tests.cluster.suites import store_tests

pytestmark = [pytest.mark.cluster, pytest.mark.redis]

globals().update(store_tests("tests.store.test_signal_store"))
