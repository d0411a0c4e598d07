"""Registered policies served: a version carries ``arl_models`` as code, pinned requirements and a signature;
MLflow refuses a malformed observation; ``arl serve`` answers over HTTP (actions, or a 400 with a message).

A small BC policy is trained once per module on a hand-built dataset (observations 3 wide, actions 2 wide,
bounds [-2, 2] x [-0.5, 0.5]) and registered as ``champion`` in the session's SQLite MLflow store.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from importlib.metadata import packages_distributions
from pathlib import Path

import numpy as np
import pytest
from pipeline_data import OBS_DIM, make_info, make_transitions
from stack_support import call, free_port, process_group

from tasks import registry, tracking

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
MODEL = "arl-serving"
LOW, HIGH = np.array([-2.0, -0.5], np.float32), np.array([2.0, 0.5], np.float32)
TAGS = dict(
    stage="bc",
    dataset_hash="cd" * 16,
    env_version="1.0.0",
    policy_hash="0123abcd",
    seed=3,
    git_commit="e" * 40,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from arl_models.data.dataset import write_dataset
    from arl_models.offline import train_bc

    root = tmp_path_factory.mktemp("serving")
    info = replace(make_info(), action_dim=2, action_low=LOW.tolist(), action_high=HIGH.tolist())
    data = write_dataset(root / "ds", make_transitions(act_dim=2), info)
    train_bc(data, root / "bc", steps=30, progress=False, eval_episodes=0)
    return root / "bc"


def _run(mlflow_uri: str, artifacts: Path) -> str:
    """A run of its own for each registration: a version's files live under its run's ``policy/``."""
    return tracking.start_parent_run(
        "arl-tests-serving", "pipeline", artifact_location=artifacts.as_uri(), tracking_uri=mlflow_uri
    )


@pytest.fixture(scope="module")
def champion(checkpoint: Path, mlflow_uri: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The trained policy registered and aliased ``champion``; returns its version."""
    run_id = _run(mlflow_uri, tmp_path_factory.mktemp("serving-artifacts"))
    reg = registry.register_policy(
        checkpoint, model_name=MODEL, run_id=run_id, tags=TAGS, tracking_uri=mlflow_uri
    )
    tracking.client(mlflow_uri).set_registered_model_alias(MODEL, "champion", reg.version)
    return reg.version


def _obs(n: int = 4) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(n, OBS_DIM)).astype(np.float32)


def test_the_registry_serves_the_policy_under_its_signature(
    checkpoint: Path, champion: str, mlflow_uri: str
) -> None:
    import mlflow.pyfunc

    from arl_models.checkpoint import load_policy

    mlflow.set_tracking_uri(mlflow_uri)
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    signature = model.metadata.signature
    assert signature.inputs.inputs[0].shape == (-1, 3) and signature.inputs.inputs[0].type == np.float32
    assert signature.outputs.inputs[0].shape == (-1, 2)
    assert signature.params.params[0].name == "deterministic"
    actions = model.predict(_obs())
    assert actions.shape == (4, 2) and actions.dtype == np.float32
    assert np.all(actions >= LOW) and np.all(actions <= HIGH)
    np.testing.assert_allclose(actions, load_policy(checkpoint).act(_obs()), rtol=1e-6)


def test_deterministic_false_samples_from_a_stochastic_policy(mlflow_uri: str, tmp_path: Path) -> None:
    import mlflow.pyfunc

    from arl_models.checkpoint import save_policy
    from arl_models.nets import TanhGaussianActor

    env = {
        "task": "safe-pendulum",
        "obs_dim": 3,
        "action_dim": 2,
        "action_low": LOW.tolist(),
        "action_high": HIGH.tolist(),
    }
    ckpt = save_policy(
        tmp_path / "sac",
        TanhGaussianActor(3, 2, (16, 16)),
        {"algo": "sac", "config": {"hidden": [16, 16]}, "env": env},
    )
    reg = registry.register_policy(
        ckpt,
        model_name=f"{MODEL}-sac",
        run_id=_run(mlflow_uri, tmp_path / "artifacts"),
        tags=TAGS,
        tracking_uri=mlflow_uri,
    )
    mlflow.set_tracking_uri(mlflow_uri)
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}-sac/{reg.version}")
    obs = np.repeat(_obs(1), 64, axis=0)
    mean, sampled = model.predict(obs), model.predict(obs, params={"deterministic": False})
    assert np.ptp(mean, axis=0).max() == 0 and np.ptp(sampled, axis=0).min() > 0
    assert np.all(sampled >= LOW) and np.all(sampled <= HIGH)


@pytest.mark.parametrize(
    ("obs", "message"),
    [
        (np.zeros((2, 4), np.float32), r"Shape of input \(2, 4\) does not match expected shape \(-1, 3\)"),
        (np.zeros((2, 2), np.float32), r"Shape of input \(2, 2\)"),
        (np.zeros(3, np.float32), r"Shape of input \(3,\)"),
        (np.zeros((2, 3), np.float64), "dtype of input float64 does not match expected dtype float32"),
        (np.array([[0.0, np.nan, 0.0], [0, 0, 0]], np.float32), r"finite numbers: row\(s\) \[0\]"),
    ],
    ids=["wide", "narrow", "one-dimensional", "float64", "nan"],
)
def test_a_malformed_observation_is_refused(
    champion: str, mlflow_uri: str, obs: np.ndarray, message: str
) -> None:
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    mlflow.set_tracking_uri(mlflow_uri)
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}/{champion}")
    with pytest.raises(MlflowException, match=message) as refused:
        model.predict(obs)
    assert refused.value.get_http_status_code() == 400


def _top_level_imports(path: Path) -> set[str]:
    """The modules a file imports when it is loaded (module-level statements, not inside functions)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def _serving_imports() -> set[str]:
    """Top-level names of the third-party modules the pyfunc and the arl_models modules it loads import."""
    seen, todo, third_party = set(), ["tasks/policy_pyfunc.py", "arl_models/checkpoint.py"], set()
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        for name in _top_level_imports(ROOT / rel):
            top = name.split(".")[0]
            if top == "arl_models":
                parts = name.split(".")
                for i in range(1, len(parts) + 1):  # the packages' __init__ files run too
                    base = ROOT.joinpath(*parts[:i])
                    todo += [
                        str(p.relative_to(ROOT))
                        for p in (base / "__init__.py", base.with_suffix(".py"))
                        if p.is_file()
                    ]
            elif top not in sys.stdlib_module_names and top != "__future__":
                third_party.add(top)
    return third_party


def test_the_model_pins_every_distribution_its_code_imports(champion: str, mlflow_uri: str) -> None:
    import mlflow.artifacts

    local = Path(mlflow.artifacts.download_artifacts(f"models:/{MODEL}/{champion}", tracking_uri=mlflow_uri))
    pins = dict(line.split("==") for line in (local / "requirements.txt").read_text().split())
    imported = _serving_imports()
    assert {"mlflow", "numpy", "torch", "safetensors"} <= imported
    assert not {top for top in imported if not set(packages_distributions()[top]) & set(pins)}, pins
    assert pins["torch"] == "2.13.0" and all("+" not in v for v in pins.values())
    assert (local / "code" / "arl_models" / "checkpoint.py").is_file() and not any(local.rglob("__pycache__"))


OUTSIDE = """
import json, sys
import numpy as np
try:
    import arl_models
except ImportError:
    pass
else:
    sys.exit(f"arl_models is importable before the model loads: {arl_models.__file__}")
import mlflow.pyfunc
model = mlflow.pyfunc.load_model(sys.argv[1])
actions = model.predict(np.asarray(json.loads(sys.argv[2]), dtype=np.float32))
print(json.dumps({"arl_models": sys.modules["arl_models"].__file__, "actions": actions.tolist()}))
"""


def test_the_model_loads_where_the_project_is_not_installed(
    checkpoint: Path, champion: str, mlflow_uri: str, tmp_path: Path
) -> None:
    """Python without its site hooks (the project's editable install is one) and site-packages by hand: only
    the model's own code/ can provide arl_models."""
    from arl_models.checkpoint import load_policy

    site = next(p for p in sys.path if p.endswith("site-packages"))
    script = tmp_path / "outside.py"
    script.write_text(f"import sys\nsys.path.append({site!r})\n{OUTSIDE}")
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    res = subprocess.run(
        [sys.executable, "-S", str(script), f"models:/{MODEL}@champion", json.dumps(_obs().tolist())],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert ROOT not in Path(out["arl_models"]).resolve().parents
    np.testing.assert_allclose(np.array(out["actions"]), load_policy(checkpoint).act(_obs()), rtol=1e-6)


@pytest.fixture
def restored_environ() -> Iterator[None]:
    """``arl serve`` sets the server's environment in its own process before it execs: put it back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_arl_serve_names_what_it_cannot_serve(
    champion: str, mlflow_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restored_environ: None
) -> None:
    from typer.testing import CliRunner

    from arl_cli.main import app

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.setenv("ARL_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    unknown = runner.invoke(app, ["serve", MODEL, "--alias", "nobody"])
    assert (
        unknown.exit_code == 2 and f"no version of model '{MODEL}' has the alias 'nobody'" in unknown.output
    )
    both = runner.invoke(app, ["serve", f"models:/{MODEL}/{champion}", "--alias", "champion"])
    assert both.exit_code == 2 and "--alias goes with a registered model's name" in both.output
    missing = runner.invoke(app, ["serve", f"models:/{MODEL}/99"])
    assert missing.exit_code == 2 and f"cannot read the model models:/{MODEL}/99" in missing.output


def _post(url: str, body: bytes) -> tuple[int, dict]:
    status, _, answer = call(url, "POST", body, **{"Content-Type": "application/json"})
    return status, json.loads(answer)


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"arl serve exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"arl serve did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


MALFORMED = {
    "wide": (
        {"inputs": [[0.1, 0.2, 0.3, 0.4]]},
        r"Shape of input \(1, 4\) does not match expected shape \(-1, 3\)",
    ),
    "narrow": ({"inputs": [[0.1, 0.2]]}, r"Shape of input \(1, 2\)"),
    "text": ({"inputs": [["a", "b", "c"]]}, "could not convert string to float"),
    "empty": ({"inputs": []}, "Failed to enforce schema"),
    "null": ({"inputs": [[0.1, None, 0.3]]}, "finite numbers"),
    "no rows key": ({"observations": [[0.1, 0.2, 0.3]]}, "exactly one of the input fields"),
}


def test_arl_serve_answers_actions_and_refuses_malformed_requests(
    checkpoint: Path, champion: str, mlflow_uri: str, tmp_path: Path
) -> None:
    import re

    from arl_models.checkpoint import load_policy

    port, log = free_port(), tmp_path / "serve.log"
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": mlflow_uri,
        "ARL_HOME": str(tmp_path / "home"),
        "OMP_NUM_THREADS": "1",
    }
    serve = [sys.executable, "-m", "arl_cli.main", "serve", MODEL, "--port", str(port)]
    with process_group(serve, log, env=env, cwd=tmp_path) as proc:
        _wait_ready(f"http://127.0.0.1:{port}/ping", proc, log)
        url = f"http://127.0.0.1:{port}/invocations"
        status, answer = _post(url, json.dumps({"inputs": _obs(2).tolist()}).encode())
        assert status == 200, answer
        actions = np.array(answer["predictions"])
        assert actions.shape == (2, 2) and np.all(actions >= LOW) and np.all(actions <= HIGH)
        np.testing.assert_allclose(actions, load_policy(checkpoint).act(_obs(2)), rtol=1e-5)
        for name, (body, message) in MALFORMED.items():
            status, answer = _post(url, json.dumps(body).encode())
            assert status == 400 and re.search(message, answer["message"]), (name, status, answer)
            assert "stack_trace" not in answer and "Traceback" not in answer["message"], name
        assert f"serving models:/{MODEL}/{champion}" in log.read_text()
