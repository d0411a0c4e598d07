"""Reference returns: the D4RL table, the measured pair, a caller's pair on import, and safe-walker2d."""

import json

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

import arl_models.data.references as references
from arl_cli.main import app
from arl_models.data import read_info
from arl_models.data.behaviour import behaviour_config, default_behaviour_dir
from arl_models.data.importers import import_d4rl
from arl_models.data.references import D4RL_REFERENCES, reference_returns, resolve_references
from arl_models.envs import get_task, make_env, task_versions

runner = CliRunner()


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """An empty home: no behaviour runs or reference caches of this machine leak in."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _hopper_file(path, n=300, seed=0):
    """A D4RL-style file of Hopper-v5 shapes (obs 11, act 3), episodes of 100 steps that time out."""
    rng = np.random.default_rng(seed)
    tout = np.zeros(n, bool)
    tout[99::100] = True
    with h5py.File(path, "w") as h:
        h["observations"] = rng.normal(size=(n, 11)).astype(np.float32)
        h["actions"] = rng.uniform(-1, 1, (n, 3)).astype(np.float32)
        h["rewards"] = rng.normal(size=n).astype(np.float32)
        h["terminals"] = np.zeros(n, bool)
        h["timeouts"] = tout
    return path


def test_import_without_references_takes_the_d4rl_table(tmp_path):
    info = import_d4rl(_hopper_file(tmp_path / "hopper.hdf5"), "safe-hopper", tmp_path / "out")
    assert (
        (info.ref_random_return, info.ref_expert_return)
        == D4RL_REFERENCES["safe-hopper"]
        == (-20.272305, 3234.3)
    )
    assert info.ref_source == "d4rl" and "Fu et al. 2020" in info.extra["references"]
    assert info.normalized_score(3234.3) == pytest.approx(100.0)
    assert read_info(tmp_path / "out").ref_source == "d4rl"  # through the sidecar


def test_given_references_win(tmp_path):
    info = import_d4rl(
        _hopper_file(tmp_path / "hopper.hdf5"), "safe-hopper", tmp_path / "out", ref_scores=(5.0, 2500.0)
    )
    assert (info.ref_random_return, info.ref_expert_return, info.ref_source) == (5.0, 2500.0, "given")


def test_given_references_must_rank_the_expert_above_random(tmp_path):
    with pytest.raises(ValueError, match="must exceed the random return"):
        import_d4rl(
            _hopper_file(tmp_path / "hopper.hdf5"), "safe-hopper", tmp_path / "out", ref_scores=(10.0, 10.0)
        )
    assert not (tmp_path / "out").exists()


def test_the_table_covers_the_nominal_plant_only():
    assert reference_returns("safe-walker2d") == (1.629008, 4592.3)
    assert reference_returns("safe-halfcheetah@2.0.0") == (-280.178953, 12135.0)  # same plant, observed
    assert reference_returns("safe-hopper@1.1.0") is None  # heavier: other returns, and no behaviour run here
    assert reference_returns("safe-pendulum") is None
    with pytest.raises(KeyError):
        reference_returns("safe-nothing")


def test_measured_references_pair_a_behaviour_expert_with_a_cached_random_return(tmp_path, monkeypatch):
    spec = get_task("safe-pendulum")
    bdir = default_behaviour_dir(spec, behaviour_config(spec.name, seed=2))
    bdir.mkdir(parents=True)
    (bdir / "behaviour.json").write_text(json.dumps({"random_return": -1234.0, "expert_return": -150.0}))
    refs = resolve_references("safe-pendulum", cache_dir=tmp_path / "refs")
    assert refs is not None and refs.source == "measured" and str(bdir) in refs.detail
    assert (
        refs.expert_return == -150.0 and -1800.0 < refs.random_return < -800.0
    )  # uniform torques on Pendulum
    cached = json.loads((tmp_path / "refs" / "safe-pendulum@1.0.0.json").read_text())
    assert cached["random_return"] == refs.random_return
    monkeypatch.setattr(references, "evaluate", lambda *a, **k: pytest.fail("measured again"))
    assert reference_returns("safe-pendulum", cache_dir=tmp_path / "refs") == (refs.random_return, -150.0)


def test_cli_import_needs_both_references(tmp_path):
    src = _hopper_file(tmp_path / "hopper.hdf5")
    res = runner.invoke(
        app,
        [
            "data",
            "import",
            str(src),
            "--task",
            "safe-hopper",
            "--out",
            str(tmp_path / "out"),
            "--ref-random",
            "0",
        ],
    )
    assert res.exit_code == 2
    assert "--ref-random and --ref-expert go together" in res.output
    assert not (tmp_path / "out").exists()


def test_cli_import_says_which_references_it_used(tmp_path):
    src = _hopper_file(tmp_path / "hopper.hdf5")
    res = runner.invoke(
        app, ["data", "import", str(src), "--task", "safe-hopper", "--out", str(tmp_path / "a")]
    )
    assert res.exit_code == 0, res.output
    assert "random -20.3 / expert 3234.3 (d4rl: D4RL" in res.output
    res = runner.invoke(
        app,
        [
            "data",
            "import",
            str(src),
            "--task",
            "safe-hopper",
            "--out",
            str(tmp_path / "b"),
            "--ref-random",
            "1",
            "--ref-expert",
            "2000",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "random 1.0 / expert 2000.0 (given" in res.output
    assert read_info(tmp_path / "b").ref_source == "given"


def test_safe_walker2d_is_registered_with_the_other_velocity_tasks_versions():
    spec = get_task("safe-walker2d")
    assert spec.env_id == "Walker2d-v5" and spec.cost_budget == 25.0
    assert task_versions("safe-walker2d") == task_versions("safe-hopper")
    env = make_env(spec)
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (17,)
        obs, _, _, _, info = env.step(env.action_space.sample())
        assert obs[spec.cost_fn.obs_index] == pytest.approx(env.unwrapped.data.qvel[0])  # the x velocity
        assert info["cost"] == float(info["x_velocity"] > 2.3415)
    finally:
        env.close()


def test_safe_walker2d_cost_fires_above_the_threshold():
    cost_fn = get_task("safe-walker2d").cost_fn
    nxt = np.zeros((3, 17), np.float32)
    nxt[:, 8] = [2.30, 2.34, 2.36]
    np.testing.assert_array_equal(cost_fn.batch_cost(np.zeros((3, 6), np.float32), nxt), [0.0, 0.0, 1.0])
    assert cost_fn(nxt[0], np.zeros(6), nxt[0], {"x_velocity": 2.35}).cost == 1.0
    assert cost_fn(nxt[0], np.zeros(6), nxt[0], {"x_velocity": 2.34}).cost == 0.0


def test_one_normalised_score_for_datasets_records_and_evaluations():
    """A dataset's sidecar, a checkpoint's record and an evaluation score a return on one scale: 0 at the
    random reference, 100 at the expert's, none where either reference is unknown."""
    from arl_models.checkpoint import record_references
    from arl_models.data.dataset import normalized_score, reference_pair
    from arl_models.evaluate import EVAL_SEED, Evaluator, evaluate
    from tests.conftest import pendulum_info

    info = pendulum_info()  # references (-1200, -150)
    assert info.references == (-1200.0, -150.0) == record_references({"env": info.__dict__})
    assert info.normalized_score(-150.0) == 100.0 and normalized_score(-1200.0, info.references) == 0.0
    assert reference_pair(None, -150.0) is None and pendulum_info(ref_expert_return=None).references is None
    spec = get_task("safe-pendulum")
    act = lambda o: np.zeros((len(o), 1))  # noqa: E731
    res = evaluate(act, spec, episodes=2, seed=EVAL_SEED, ref_scores=info.references)
    assert res.normalized_score == pytest.approx(info.normalized_score(res.mean_return))
    assert (
        Evaluator(act, spec, 2, info.references, prefix="x/")()["x/normalized_score"] == res.normalized_score
    )
    assert "eval/normalized_score" not in Evaluator(act, spec, 2)()
