import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arl_models.data.dataset import (
    TRANSITIONS_FILE,
    DatasetError,
    Transitions,
    merge_datasets,
    read_dataset,
    read_table,
    write_dataset,
)
from tests.conftest import make_transitions, pendulum_info


def test_roundtrip_preserves_every_column(tmp_path):
    t = make_transitions()
    write_dataset(tmp_path / "d", t, pendulum_info())
    back, info = read_dataset(tmp_path / "d")
    for k, v in t.__dict__.items():
        np.testing.assert_array_equal(getattr(back, k), v, err_msg=k)
    assert info.num_transitions == len(t) and info.num_episodes == 4
    assert back.obs.flags["C_CONTIGUOUS"] and back.obs.dtype == np.float32


def test_episode_returns_and_costs_sum_per_episode():
    t = make_transitions(n_episodes=3, length=10)
    np.testing.assert_allclose(t.episode_returns(), t.reward.reshape(3, 10).sum(1), rtol=1e-5)
    np.testing.assert_allclose(t.episode_costs(), t.cost.reshape(3, 10).sum(1))


def _rewrite(path, table):
    pq.write_table(table, path / TRANSITIONS_FILE)


def test_missing_column_is_named(tiny_dataset):
    _rewrite(tiny_dataset, read_table(tiny_dataset).drop_columns(["cost"]))
    with pytest.raises(DatasetError, match=r"missing column\(s\) \['cost'\]"):
        read_dataset(tiny_dataset)


def test_wrong_observation_width_is_named(tiny_dataset):
    table = read_table(tiny_dataset)
    n = table.num_rows
    wide = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n * 4, np.float32)), 4)
    _rewrite(tiny_dataset, table.set_column(table.column_names.index("obs"), "obs", wide))
    with pytest.raises(DatasetError, match=r"column 'obs' has 800 values for 200 rows; expected dimension 3"):
        read_dataset(tiny_dataset)


def test_null_metadata_is_refused(tiny_dataset):
    table = read_table(tiny_dataset)
    seeds = pa.array([None] + [1] * (table.num_rows - 1), type=pa.int64())
    _rewrite(tiny_dataset, table.set_column(table.column_names.index("random_seed"), "random_seed", seeds))
    with pytest.raises(DatasetError, match=r"column 'random_seed' has 1 null"):
        read_dataset(tiny_dataset)


def test_wrong_type_is_named(tiny_dataset):
    table = read_table(tiny_dataset)
    bad = pa.array(["x"] * table.num_rows)
    _rewrite(tiny_dataset, table.set_column(table.column_names.index("reward"), "reward", bad))
    with pytest.raises(DatasetError, match=r"column 'reward' has type string, expected float"):
        read_dataset(tiny_dataset)


def test_not_a_dataset(tmp_path):
    with pytest.raises(DatasetError, match="missing dataset.json"):
        read_dataset(tmp_path)


def test_failed_write_leaves_previous_dataset_intact(tmp_path, monkeypatch):
    path = tmp_path / "d"
    write_dataset(path, make_transitions(seed=1), pendulum_info())
    before = (path / TRANSITIONS_FILE).read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", boom)
    with pytest.raises(OSError, match="disk full"):
        write_dataset(path, make_transitions(seed=2), pendulum_info())
    assert (path / TRANSITIONS_FILE).read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["d"]  # no temporary directory left behind


def test_bad_shape_fails_before_anything_is_written(tmp_path):
    t = make_transitions()
    t.reward = t.reward[:-1]
    with pytest.raises(DatasetError, match="column 'reward'"):
        write_dataset(tmp_path / "d", t, pendulum_info())
    assert list(tmp_path.iterdir()) == []


def test_overwrite_replaces_whole_dataset(tmp_path):
    path = tmp_path / "d"
    write_dataset(path, make_transitions(n_episodes=2), pendulum_info())
    write_dataset(path, make_transitions(n_episodes=3), pendulum_info(quality="expert"))
    t, info = read_dataset(path)
    assert len(t) == 150 and info.quality == "expert"
    assert json.loads((path / "dataset.json").read_text())["num_episodes"] == 3


def test_select_and_concat():
    t = make_transitions()
    parts = [t.select(t.episode_id < 2), t.select(t.episode_id >= 2)]
    joined = Transitions.concat(parts)
    np.testing.assert_array_equal(joined.obs, t.obs)


def _part(tmp_path, name, seed, policy, **info):
    t = make_transitions(n_episodes=3, length=20, seed=seed)
    t.policy_hash[:] = policy
    cost = "EffortCost(threshold=1.0)"
    return write_dataset(
        tmp_path / name, t, pendulum_info(**{"extra": {"max_episode_steps": 200, "cost_fn": cost}} | info)
    )


def test_merge_keeps_every_row_and_its_metadata_with_distinct_episodes(tmp_path):
    a = _part(tmp_path, "a", 0, "aa" * 32, quality="medium", ref_expert_return=-150.0)
    b = _part(
        tmp_path, "b", 1, "bb" * 32, quality="expert", ref_random_return=-1300.0, ref_expert_return=-140.0
    )
    info = merge_datasets([a, b], tmp_path / "m")
    rows, _ = read_dataset(tmp_path / "m")
    (ta, _), (tb, _) = read_dataset(a), read_dataset(b)
    assert (info.num_transitions, info.num_episodes) == (120, 6) and info.quality == "mixed"
    np.testing.assert_array_equal(rows.obs, np.concatenate([ta.obs, tb.obs]))
    assert list(rows.policy_hash[:60]) == list(ta.policy_hash) and list(rows.policy_hash[60:]) == list(
        tb.policy_hash
    )
    assert set(rows.episode_id[:60]).isdisjoint(rows.episode_id[60:])
    assert (info.ref_random_return, info.ref_expert_return) == (-1300.0, -140.0)
    assert [m["quality"] for m in info.extra["merged_from"]] == ["medium", "expert"]
    assert info.extra["cost_fn"] == "EffortCost(threshold=1.0)"


@pytest.mark.parametrize(
    ("field", "value"), [("env_version", "1.1.0"), ("cost_budget", 20.0), ("extra", {"cost_fn": "Other()"})]
)
def test_merge_refuses_parts_that_disagree_and_writes_nothing(tmp_path, field, value):
    a = _part(tmp_path, "a", 0, "aa" * 32)
    b = _part(tmp_path, "b", 1, "bb" * 32, **{field: value})
    with pytest.raises(DatasetError, match=rf"{b}: .*{field if field != 'extra' else 'cost labelled by'}"):
        merge_datasets([a, b], tmp_path / "m")
    assert not (tmp_path / "m").exists()
