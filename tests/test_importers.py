"""Importers: a D4RL-style HDF5 file and a Minari dataset directory, written here with h5py; relabelling."""

import h5py
import numpy as np
import pytest

from arl_models.data import DatasetError, read_dataset
from arl_models.data.importers import import_d4rl, import_minari, relabel_costs
from arl_models.envs import get_task


def _episodes(n_eps=3, length=5, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (
            rng.normal(size=(length + 1, 3)).astype(np.float32),
            rng.uniform(-2, 2, (length, 1)).astype(np.float32),
            rng.normal(size=length).astype(np.float32),
        )
        for _ in range(n_eps)
    ]


def test_d4rl_file_with_timeouts_drops_the_unfinished_step(tmp_path):
    eps = _episodes()
    obs = np.concatenate([o[:-1] for o, _, _ in eps])
    act = np.concatenate([a for _, a, _ in eps])
    rew = np.concatenate([r for _, _, r in eps])
    n = len(obs)
    term, tout = np.zeros(n, bool), np.zeros(n, bool)
    term[4] = True  # episode 0 terminates at its last step
    tout[9] = True  # episode 1 times out
    term[14] = True
    f = tmp_path / "hopper.hdf5"
    with h5py.File(f, "w") as h:
        for k, v in dict(observations=obs, actions=act, rewards=rew, terminals=term, timeouts=tout).items():
            h[k] = v
    import_d4rl(f, "safe-pendulum", tmp_path / "out", seed=3)
    t, info = read_dataset(tmp_path / "out")
    assert len(t) == n - 1  # the timeout row has no next observation in the file
    assert t.terminated.sum() == 2 and t.truncated.sum() == 1
    assert list(np.unique(t.episode_id)) == [0, 1, 2]
    assert t.step[5:9].tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(t.next_obs[0], obs[1])
    overload = np.clip(np.abs(t.action[:, 0]) - get_task("safe-pendulum").cost_fn.threshold, 0.0, 1.0)
    np.testing.assert_allclose(t.cost, overload, atol=1e-6)  # each row its own torque
    assert set(t.random_seed.tolist()) == {3} and len(t.policy_hash[0]) == 64
    assert info.source == "d4rl:hopper.hdf5"
    assert info.extra["cost_fn"] == repr(get_task("safe-pendulum").cost_fn)  # computed here, so recorded


def test_d4rl_file_missing_a_key_is_named(tmp_path):
    f = tmp_path / "bad.hdf5"
    with h5py.File(f, "w") as h:
        h["observations"] = np.zeros((3, 3), np.float32)
    with pytest.raises(
        DatasetError, match=r"missing dataset\(s\) \['actions', 'rewards', 'terminals', 'timeouts'\]"
    ):
        import_d4rl(f, "safe-pendulum", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_d4rl_wrong_observation_width_is_named(tmp_path):
    f = tmp_path / "bad.hdf5"
    with h5py.File(f, "w") as h:
        h["observations"] = np.zeros((3, 4), np.float32)
        h["actions"] = np.zeros((3, 1), np.float32)
        for k in ("rewards", "terminals", "timeouts"):
            h[k] = np.zeros(3)
    with pytest.raises(
        DatasetError, match=r"observations have shape \(3, 4\); task safe-pendulum@1.0.0 needs \(N, 3\)"
    ):
        import_d4rl(f, "safe-pendulum", tmp_path / "out")


def test_minari_directory(tmp_path):
    eps = _episodes(n_eps=2, length=4)
    d = tmp_path / "pendulum-v0" / "data"
    d.mkdir(parents=True)
    with h5py.File(d / "main_data.hdf5", "w") as h:
        for i, (o, a, r) in enumerate(eps):
            g = h.create_group(f"episode_{i}")
            g["observations"], g["actions"], g["rewards"] = o, a, r
            g["terminations"] = np.zeros(4, bool)
            g["truncations"] = np.array([0, 0, 0, 1], bool)
            g.create_group("infos")["cost"] = np.ones(4, np.float32)
    import_minari(tmp_path / "pendulum-v0", "safe-pendulum", tmp_path / "out")
    t, info = read_dataset(tmp_path / "out")
    assert len(t) == 8 and info.num_episodes == 2
    np.testing.assert_array_equal(t.next_obs[:4], eps[0][0][1:])
    assert t.cost.tolist() == [1.0] * 8  # the source's own costs win
    assert t.step.tolist() == [0, 1, 2, 3] * 2


def test_minari_not_a_dataset(tmp_path):
    with pytest.raises(DatasetError, match="not a Minari dataset directory"):
        import_minari(tmp_path, "safe-pendulum", tmp_path / "out")


def test_relabel_recomputes_costs_and_keeps_everything_else(tiny_dataset, tmp_path):
    from typer.testing import CliRunner

    from arl_cli.main import app

    old, info = read_dataset(tiny_dataset)
    new_info = relabel_costs(tiny_dataset, tmp_path / "relabelled")
    t, _ = read_dataset(tmp_path / "relabelled")
    np.testing.assert_allclose(t.cost, np.clip(np.abs(t.action[:, 0]) - 1.0, 0.0, 1.0), atol=1e-6)
    assert not np.allclose(t.cost, old.cost)  # the fixture's costs are random draws, not the task's
    for name in ("obs", "action", "reward", "next_obs", "episode_id", "step", "policy_hash", "timestamp"):
        np.testing.assert_array_equal(getattr(t, name), getattr(old, name))
    assert new_info.extra["cost_fn"] == repr(get_task("safe-pendulum").cost_fn)
    assert (
        new_info.extra["relabelled_from"] == "unrecorded" and new_info.num_transitions == info.num_transitions
    )
    res = CliRunner().invoke(app, ["data", "relabel", str(tiny_dataset), "--out", str(tmp_path / "cli")])
    assert res.exit_code == 0 and "costs by ActuatorEffortCost" in res.output, res.output
