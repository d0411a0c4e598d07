"""The MLflow registry on SQLite: a checkpoint becomes a pyfunc version; aliases follow the gate."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from tasks import registry, tracking

pytestmark = pytest.mark.e2e
GATE = {"tolerance": 1.0, "cost_budget": 5.0, "max_forgetting": 2.0}
TRACE = {
    "stage": "cql",
    "dataset_hash": "ab" * 16 + ".dir",
    "env_version": "1.0.0",
    "policy_hash": "0123abcd",
    "seed": 7,
    "git_commit": "f" * 40,
}


class _LinearPolicy:
    def __init__(self, w: np.ndarray):
        self.w = w

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return np.tanh(obs @ self.w)


@pytest.fixture
def fake_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in for ``arl_models.checkpoint.load_policy``: a JSON weight matrix (tests the wiring only)."""
    module = types.ModuleType("arl_models.checkpoint")
    module.load_policy = lambda path: _LinearPolicy(np.array(json.loads((Path(path) / "w.json").read_text())))
    module.handed_over = Path
    monkeypatch.setitem(sys.modules, "arl_models.checkpoint", module)


def _checkpoint(path: Path, scale: float) -> Path:
    path.mkdir(parents=True)
    (path / "w.json").write_text(json.dumps((scale * np.eye(3, 2)).tolist()))
    return path


@pytest.fixture(scope="module")
def run_id(mlflow_uri: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    artifacts = tmp_path_factory.mktemp("registry-artifacts").as_uri()
    return tracking.start_parent_run(
        "arl-tests-registry", "pipeline", artifact_location=artifacts, tracking_uri=mlflow_uri
    )


def test_register_and_predict(fake_checkpoints: None, mlflow_uri: str, run_id: str, tmp_path: Path) -> None:
    import mlflow.pyfunc

    reg = registry.register_policy(
        _checkpoint(tmp_path / "ckpt", 0.5),
        model_name="arl-predict",
        run_id=run_id,
        tags=TRACE,
        tracking_uri=mlflow_uri,
    )
    mv = tracking.client(mlflow_uri).get_model_version("arl-predict", reg.version)
    assert mv.tags["arl.dataset_hash"] == TRACE["dataset_hash"] and mv.tags["arl.seed"] == "7"
    assert mv.run_id == run_id
    mlflow.set_tracking_uri(mlflow_uri)
    model = mlflow.pyfunc.load_model(f"models:/arl-predict/{reg.version}")
    obs = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(model.predict(obs), np.tanh(obs @ (0.5 * np.eye(3, 2))), rtol=1e-6)
    logged = {Path(a.path).name for a in tracking.client(mlflow_uri).list_artifacts(run_id, "policy")}
    assert "policy_pyfunc.py" in logged and not any(n.endswith((".pkl", ".cloudpickle")) for n in logged)


def test_missing_trace_tags_are_refused(mlflow_uri: str, run_id: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="git_commit"):
        registry.register_policy(
            tmp_path,
            model_name="arl-x",
            run_id=run_id,
            tags={**TRACE, "git_commit": ""},
            tracking_uri=mlflow_uri,
        )


def test_champion_kept_when_worse_candidate_arrives(
    fake_checkpoints: None, mlflow_uri: str, run_id: str, tmp_path: Path
) -> None:
    name = "arl-aliases"
    versions = [
        registry.register_policy(
            _checkpoint(tmp_path / f"c{i}", i),
            model_name=name,
            run_id=run_id,
            tags=TRACE,
            tracking_uri=mlflow_uri,
        ).version
        for i in range(4)
    ]

    def gate(version: str, score: float, cost: float = 1.0) -> registry.Decision:
        candidate = {"score": score, "mean_cost": cost, "data_validated": True}
        return registry.promote(name, version, candidate, **GATE, tracking_uri=mlflow_uri)

    def alias(a: str) -> str | None:
        return registry.alias_version(name, a, tracking_uri=mlflow_uri)

    assert gate(versions[0], 50.0).promote and alias("champion") == versions[0]
    worse = gate(versions[1], 40.0)
    assert not worse.promote and "below champion 50" in worse.reason
    assert alias("champion") == versions[0] and alias("challenger") == versions[1]
    unsafe = gate(versions[2], 90.0, cost=7.0)
    assert not unsafe.promote and alias("champion") == versions[0] and alias("challenger") == versions[2]
    assert gate(versions[3], 55.0).promote and alias("champion") == versions[3]
    c = tracking.client(mlflow_uri)
    tags = c.get_model_version(name, versions[1]).tags
    assert tags["arl.promotion"] == "challenger" and "below champion" in tags["arl.promotion.reason"]
    assert c.get_model_version(name, versions[0]).tags["arl.promotion.replaced_by"] == versions[3]
    assert registry.gate_metrics(name, versions[3], tracking_uri=mlflow_uri)["score"] == 55.0


def test_a_champion_scored_against_other_references_is_scored_again(
    fake_checkpoints: None, mlflow_uri: str, run_id: str, tmp_path: Path
) -> None:
    name = "arl-references"
    v = [
        registry.register_policy(
            _checkpoint(tmp_path / f"r{i}", i),
            model_name=name,
            run_id=run_id,
            tags=TRACE,
            tracking_uri=mlflow_uri,
        ).version
        for i in range(3)
    ]
    first = {"score": 90.0, "mean_cost": 1.0, "data_validated": True, "references": "random 0, expert 100"}
    assert registry.promote(name, v[0], first, **GATE, tracking_uri=mlflow_uri).promote
    rescored: list[str] = []

    def rescore(version: str) -> dict:  # the champion on the candidate's version scores 40 there
        rescored.append(version)
        return {"score": 40.0, "references": "random 10, expert 50"}

    candidate = {
        "score": 45.0,
        "mean_cost": 1.0,
        "data_validated": True,
        "references": "random 10, expert 50",
    }
    without = registry.promote(name, v[1], candidate, **GATE, tracking_uri=mlflow_uri)
    assert not without.promote and "not comparable" in without.reason  # 45 is never compared with 90
    d = registry.promote(name, v[2], candidate, **GATE, tracking_uri=mlflow_uri, rescore=rescore)
    assert d.promote and rescored == [v[0]] and "re-scored" in d.reason and "40" in d.reason
    assert registry.alias_version(name, "champion", tracking_uri=mlflow_uri) == v[2]


def test_real_checkpoint_round_trip(mlflow_uri: str, run_id: str, tmp_path: Path) -> None:
    """A checkpoint written by arl_models serves the same actions through the registry."""
    import mlflow.pyfunc

    from arl_models.checkpoint import load_policy, save_policy
    from arl_models.nets import TanhGaussianActor

    env = {
        "task": "safe-pendulum",
        "obs_dim": 3,
        "action_dim": 2,
        "action_low": [-2, -2],
        "action_high": [2, 2],
    }
    record = {"algo": "sac", "config": {"hidden": [16, 16]}, "env": env}
    ckpt = save_policy(tmp_path / "ckpt", TanhGaussianActor(3, 2, (16, 16)), record)
    mlflow.set_tracking_uri(mlflow_uri)
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)

    def served(name: str) -> np.ndarray:
        reg = registry.register_policy(
            ckpt, model_name=name, run_id=run_id, tags=TRACE, tracking_uri=mlflow_uri
        )
        return mlflow.pyfunc.load_model(f"models:/{name}/{reg.version}").predict(obs)

    np.testing.assert_allclose(served("arl-real"), load_policy(ckpt).act(obs, deterministic=True), rtol=1e-6)
    # a fine-tuning stage's checkpoint holds the policy it hands over in best/: that one is served
    save_policy(ckpt / "best", TanhGaussianActor(3, 2, (16, 16)), record)
    best = load_policy(ckpt / "best").act(obs, deterministic=True)
    assert not np.allclose(best, load_policy(ckpt).act(obs, deterministic=True))
    np.testing.assert_allclose(served("arl-real-best"), best, rtol=1e-6)


def test_registering_and_loading_print_nothing(
    mlflow_uri: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """No "Add type hints" or "input example" warning, no "Downloading artifacts" bar, no INFO line: a
    registration is silent; the model carries its example request."""
    import warnings

    import mlflow.pyfunc

    from arl_models.checkpoint import save_policy
    from arl_models.nets import TanhGaussianActor

    env = {"task": "safe-pendulum", "obs_dim": 3, "action_dim": 1, "action_low": [-2], "action_high": [2]}
    ckpt = save_policy(
        tmp_path / "ckpt",
        TanhGaussianActor(3, 1, (8, 8)),
        {"algo": "sac", "config": {"hidden": [8, 8]}, "env": env},
    )
    run_id = tracking.start_parent_run(  # a run of its own: its policy/ holds this checkpoint only
        "arl-tests-registry",
        "quiet",
        artifact_location=(tmp_path / "artifacts").as_uri(),
        tracking_uri=mlflow_uri,
    )
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg = registry.register_policy(
            ckpt, model_name="arl-quiet", run_id=run_id, tags=TRACE, tracking_uri=mlflow_uri
        )
        mlflow.set_tracking_uri(mlflow_uri)
        model = mlflow.pyfunc.load_model(f"models:/arl-quiet/{reg.version}")
    out, err = capfd.readouterr()
    mlflow_warnings = [str(w.message) for w in caught if "mlflow" in w.filename]
    assert mlflow_warnings == [] and out == "" and err == "", (mlflow_warnings, out, err)
    assert model.predict(np.zeros((2, 3), dtype=np.float32)).shape == (2, 1)
    logged = {Path(a.path).name for a in tracking.client(mlflow_uri).list_artifacts(run_id, "policy")}
    assert "serving_input_example.json" in logged
