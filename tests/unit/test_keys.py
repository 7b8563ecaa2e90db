"""Key safety: hostile names never inject a hash tag, never collide, stay bounded, land in the right slot."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from litellm_ratebalance.admission.policy import pool_field
from litellm_ratebalance.errors import ConfigurationError
from litellm_ratebalance.store.concurrency import RedisConcurrencyStore
from litellm_ratebalance.store.keys import MAX_ESCAPED_NAME_LENGTH, KeySpace, escape_name
from litellm_ratebalance.store.routing import _bucket_key, _limits_key

hostile = st.text(
    alphabet=st.sampled_from(list("ab{}:%~ _-.\x00\n\u00e9\u4e2d\U0001f600")) | st.characters(), max_size=300
)


def hash_tag(key: str) -> str:
    """The part Redis Cluster hashes: between the first '{' and the next '}' (if non-empty)."""
    start = key.find("{")
    if start == -1:
        return key
    end = key.find("}", start + 1)
    if end == -1 or end == start + 1:
        return key
    return key[start + 1 : end]


@given(hostile)
def test_escaped_names_are_safe_and_bounded(name: str) -> None:
    escaped = escape_name(name)
    assert len(escaped) <= MAX_ESCAPED_NAME_LENGTH
    assert not set(escaped) & set("{}: \n\x00")


@settings(max_examples=500)
@given(hostile, hostile)
def test_distinct_names_give_distinct_keys(a: str, b: str) -> None:
    keys = KeySpace("rb")
    if a != b:
        assert keys.admission_window(a) != keys.admission_window(b)
        assert keys.routing_tag(a) != keys.routing_tag(b)


@given(hostile)
def test_each_model_group_key_hashes_on_its_own_escaped_name(name: str) -> None:
    keys = KeySpace("rb")
    assert hash_tag(keys.admission_window(name)) == "adm:" + escape_name(name)
    assert hash_tag(keys.routing_tag(name) + ":x") == "rt:" + escape_name(name)
    assert hash_tag(keys.concurrency_tag(name)) == "bp:" + escape_name(name)


def test_separator_cannot_fake_another_key() -> None:
    keys = KeySpace("rb")
    assert keys.admission_window("a}:window") != keys.admission_window("a")
    assert escape_name("a:b") != escape_name("a") + ":b"


def test_long_names_are_hashed_not_cut_into_collisions() -> None:
    a, b = "x" * 200 + "1", "x" * 200 + "2"
    assert escape_name(a) != escape_name(b)
    assert "~" in escape_name(a)


@pytest.mark.parametrize("prefix", ["", "a{b", "a}b", "has space", "x" * 65])
def test_bad_prefix_is_refused_with_key_path(prefix: str) -> None:
    with pytest.raises(ConfigurationError, match=r"ratebalance\.key_prefix"):
        KeySpace(prefix)


def test_contract_window_keys_share_a_slot_per_window() -> None:
    keys = KeySpace("rb")
    assert hash_tag(keys.contract_window("rpm", 1789057680)) == hash_tag(keys.contract_window("tpm", 1789057680))
    assert keys.contract_window("rpm", 1789057680) == "rb:traffic_contract:rpm:{1789057680}"


# -- every user-supplied name of a request, together -------------------------------------------------------
# The names one request brings (model group, priority, feature, deployment id, team/key id) become keys and
# hash fields through the part modules' own builders; hostile tuples must keep every key and field distinct,
# bounded, and on the slot of the name it belongs to.

hostile_name = st.one_of(
    hostile,
    st.text(alphabet=st.sampled_from(list("{}:|%~.")), min_size=1, max_size=12),  # only separators and tags
    st.text(min_size=200, max_size=2000),  # past the length bound: truncated and hashed
)
NameTuple = tuple[str, str, str, str, str]
name_tuples = st.tuples(hostile_name, hostile_name, hostile_name, hostile_name, hostile_name)

MAX_KEY_LENGTH = len("rb") + 40 + MAX_ESCAPED_NAME_LENGTH
"""The prefix, the fixed parts of the longest key layout (a routing bucket key with its width and index),
and one escaped name."""


class _Leases(RedisConcurrencyStore):
    def __init__(self, keys: KeySpace) -> None:
        self._keys = keys


def script_keys(keys: KeySpace, names: NameTuple) -> dict[str, list[str]]:
    """The KEYS of each script a request with these names runs, as the stores build them."""
    model_group, _priority, _feature, deployment, _team = names
    return {
        "admission": [keys.admission_window(model_group)],
        "routing": [
            _bucket_key(keys, model_group, 2000, 7),
            _bucket_key(keys, model_group, 2000, 8),
            _limits_key(keys, model_group),
        ],
        "concurrency": _Leases(keys)._lease_keys(deployment),
        "contracts": [keys.contract_window("rpm", 1_789_057_680), keys.contract_window("tpm", 1_789_057_680)],
    }


def fields(keys: KeySpace, names: NameTuple) -> dict[str, set[str]]:
    """The hash fields each name becomes (the suffixes are the ones the Lua scripts append)."""
    _model_group, priority, feature, deployment, team = names
    feature_field = keys.field(feature)
    deployment_field = keys.field(deployment)
    return {
        "priority": {pool_field(priority, escape_name(priority))},
        "feature": {feature_field, feature_field + ":inflight"},
        "deployment": {deployment_field + "|id", deployment_field + "|h3"},
        "team": {keys.field(team)},
    }


@settings(max_examples=300, deadline=None)
@given(name_tuples)
def test_every_script_runs_on_one_slot_chosen_by_its_own_name(names: NameTuple) -> None:
    keys = KeySpace("rb")
    model_group, _, _, deployment, _ = names
    expected_tag = {
        "admission": "adm:" + escape_name(model_group),
        "routing": "rt:" + escape_name(model_group),
        "concurrency": "bp:" + escape_name(deployment),
        "contracts": "1789057680",
    }
    for script, script_key_list in script_keys(keys, names).items():
        # redis-py's own slot function (what a cluster client and server compute): one slot per script,
        # the slot of the tag we built; a brace in the name cannot move it.
        assert {key_slot(key.encode()) for key in script_key_list} == {key_slot(expected_tag[script].encode())}
        assert all(hash_tag(key) == expected_tag[script] for key in script_key_list)
        assert all(len(key) <= MAX_KEY_LENGTH for key in script_key_list)


@settings(max_examples=300, deadline=None)
@given(name_tuples, name_tuples)
def test_different_name_tuples_never_share_a_key_or_field(a: NameTuple, b: NameTuple) -> None:
    keys = KeySpace("rb")
    keys_a, keys_b = script_keys(keys, a), script_keys(keys, b)
    owner = {"admission": 0, "routing": 0, "concurrency": 3, "contracts": None}
    for script, index in owner.items():
        if index is None:
            continue  # contract keys depend on the window only
        if a[index] != b[index]:
            assert not set(keys_a[script]) & set(keys_b[script]), script
        else:
            assert keys_a[script] == keys_b[script]
    # No key of one layout can equal a key of another layout, whatever the names.
    flat_a = [(script, key) for script, ks in keys_a.items() for key in ks]
    flat_b = [(script, key) for script, ks in keys_b.items() for key in ks]
    for script_a, key_a in flat_a:
        for script_b, key_b in flat_b:
            if script_a != script_b:
                assert key_a != key_b
    fields_a, fields_b = fields(keys, a), fields(keys, b)
    for kind, index in {"priority": 1, "feature": 2, "deployment": 3, "team": 4}.items():
        if a[index] != b[index]:
            assert not fields_a[kind] & fields_b[kind], kind
    assert all(len(name) <= MAX_ESCAPED_NAME_LENGTH + len(":inflight") for f in fields_a.values() for name in f)


@settings(max_examples=200, deadline=None)
@given(hostile_name)
def test_fields_of_different_roles_in_one_hash_cannot_collide(name: str) -> None:
    """A feature's counter field and its in-flight field, a deployment's statistics fields and a pool field
    are told apart by suffixes and prefixes the escaped form never contains (``:``, ``|``)."""
    escaped = escape_name(name)
    assert ":" not in escaped and "|" not in escaped
    assert pool_field(name, escaped) != pool_field(None)  # a priority named "d" is not the default pool
    assert escape_name(name + ":inflight") != escaped + ":inflight"
