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
