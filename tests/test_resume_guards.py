"""A checkpoint folder resumes only the run that wrote it, and a diverging step stops before it is saved."""

import functools
import math

import numpy as np
import pytest

from arl_models import offline
from arl_models.checkpoint import WEIGHTS, ResumeMismatch, has_train_state, read_config
from arl_models.data.dataset import write_dataset
from arl_models.offline import train_bc, train_cql
from arl_models.train import DIVERGED_ABOVE, TrainingDiverged, check_finite
from tests.conftest import make_transitions, pendulum_info

TINY = dict(preset="demo", progress=False, eval_episodes=0)


def _interrupted(data, out, monkeypatch, **kw):
    """A CQL run of 60 steps stopped after 25, its checkpoint left in ``out``."""
    with monkeypatch.context() as m:
        m.setattr(offline, "fit", functools.partial(offline.fit, stop_after=25))
        train_cql(data, out, steps=60, **TINY, **kw)
    assert has_train_state(out)


def test_another_seed_is_refused_and_named(tiny_dataset, tmp_path, monkeypatch):
    out = tmp_path / "cql"
    _interrupted(tiny_dataset, out, monkeypatch, seed=0)
    before = (out / WEIGHTS).read_bytes()
    with pytest.raises(ResumeMismatch, match=r"config\.seed was 0, now 1.*--restart"):
        train_cql(tiny_dataset, out, steps=60, seed=1, **TINY)
    assert (out / WEIGHTS).read_bytes() == before


def test_other_data_under_the_same_path_is_refused(tmp_path, monkeypatch):
    data, out = tmp_path / "data", tmp_path / "cql"
    write_dataset(data, make_transitions(seed=0), pendulum_info())
    _interrupted(data, out, monkeypatch)
    write_dataset(data, make_transitions(seed=1), pendulum_info())
    with pytest.raises(ResumeMismatch, match=r"dataset\.digest was '[0-9a-f]{64}', now '[0-9a-f]{64}'"):
        train_cql(data, out, steps=60, **TINY)


def test_restart_starts_over(tiny_dataset, tmp_path, monkeypatch):
    out, fresh = tmp_path / "cql", tmp_path / "fresh"
    _interrupted(tiny_dataset, out, monkeypatch, seed=0)
    assert train_cql(tiny_dataset, out, steps=60, seed=1, restart=True, **TINY)["steps"] == 60
    train_cql(tiny_dataset, fresh, steps=60, seed=1, **TINY)
    assert (out / WEIGHTS).read_bytes() == (fresh / WEIGHTS).read_bytes()
    assert read_config(out)["config"]["seed"] == 1


def test_a_longer_run_continues_a_shorter_one(tiny_dataset, tmp_path):
    out = tmp_path / "bc"
    train_bc(tiny_dataset, out, steps=20, **TINY)
    assert train_bc(tiny_dataset, out, steps=40, **TINY)["steps"] == 40


def test_a_nan_reward_stops_training_naming_the_loss_and_saves_nothing(tmp_path):
    t = make_transitions()
    t.reward[7] = np.nan
    data, out = tmp_path / "nan", tmp_path / "cql"
    write_dataset(data, t, pendulum_info())
    with pytest.raises(TrainingDiverged, match=r"step 1: .*loss_critic = nan"):
        train_cql(data, out, steps=60, **TINY)
    assert not (out / WEIGHTS).exists() and not has_train_state(out)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 2 * DIVERGED_ABOVE])
def test_runaway_values_are_named(value):
    with pytest.raises(TrainingDiverged, match="q_mean"):
        check_finite({"loss": 1.0, "q_mean": value}, 3, "cql")
    check_finite({"loss": 1.0, "q_mean": -DIVERGED_ABOVE}, 3, "cql")


def test_cli_names_the_mismatch_and_restarts_when_told(tiny_dataset, tmp_path):
    from typer.testing import CliRunner

    from arl_cli.main import app

    out = tmp_path / "bc"
    args = ["train", "bc", "--data", str(tiny_dataset), "--out", str(out), "--steps", "20"]
    assert CliRunner().invoke(app, args).exit_code == 0
    refused = CliRunner().invoke(app, [*args, "--seed", "1"])
    assert refused.exit_code == 2 and "config.seed was 0, now 1" in refused.output
    assert CliRunner().invoke(app, [*args, "--seed", "1", "--restart"]).exit_code == 0
    assert read_config(out)["config"]["seed"] == 1
