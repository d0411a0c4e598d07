"""Checkpoints: safetensors only, identical actions after reload, and resume == uninterrupted."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from arl_models.checkpoint import WEIGHTS, load_policy, read_config
from arl_models.offline import train_bc, train_cql

TINY = dict(preset="demo", progress=False, eval_episodes=0)


def test_checkpoint_files_are_safetensors_and_json(tiny_dataset, tmp_path):
    out = tmp_path / "bc"
    train_bc(tiny_dataset, out, steps=20, **TINY)
    names = {p.name for p in out.iterdir()}
    assert {WEIGHTS, "config.json", "metrics.json", "metrics.jsonl", "train_state"} <= names
    assert not list(out.rglob("*.pt")) and not list(out.rglob("*.pkl"))
    with open(out / WEIGHTS, "rb") as f:  # safetensors: 8-byte header length, then a JSON header
        header_len = int.from_bytes(f.read(8), "little")
        json.loads(f.read(header_len))
    cfg = read_config(out)
    assert cfg["algo"] == "bc" and cfg["env"]["task"] == "safe-pendulum"


@pytest.mark.parametrize("policy", ["gaussian", "deterministic"])
def test_saved_policy_acts_like_the_trained_one(tiny_dataset, tmp_path, policy):
    from dataclasses import replace

    from arl_models.presets import get_preset

    out = tmp_path / "bc"
    train_bc(tiny_dataset, out, steps=30, config=replace(get_preset("demo").bc, policy=policy), **TINY)
    p1, p2 = load_policy(out), load_policy(out)
    obs = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    a = p1.act(obs)
    np.testing.assert_array_equal(a, p2.act(obs))
    assert a.shape == (16, 1) and np.all(np.abs(a) <= 2.0)
    assert p1.act(obs[0]).shape == (1,)


def _weights(out):
    from safetensors.torch import load_file

    return load_file(str(out / WEIGHTS))


def test_resume_after_interrupt_reaches_the_same_weights(tiny_dataset, tmp_path, monkeypatch):
    import functools

    from arl_models import offline

    full, parts = tmp_path / "full", tmp_path / "parts"
    train_cql(tiny_dataset, full, steps=60, seed=5, **TINY)
    # interrupt after 25 steps (a checkpoint is written), then run again to completion
    with monkeypatch.context() as m:
        m.setattr(offline, "fit", functools.partial(offline.fit, stop_after=25))
        first = train_cql(tiny_dataset, parts, steps=60, seed=5, **TINY)
    assert first["steps"] == 25
    second = train_cql(tiny_dataset, parts, steps=60, seed=5, **TINY)
    assert second["steps"] == 60
    a, b = _weights(full), _weights(parts)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [json.loads(line)["step"] for line in (parts / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # no duplicated log lines after resuming
    # asked again, the finished checkpoint is left as it is and its record returned
    files = {f: f.read_bytes() for f in parts.rglob("*") if f.is_file()}
    assert train_cql(tiny_dataset, parts, steps=60, seed=5, **TINY) == second
    assert files == {f: f.read_bytes() for f in parts.rglob("*") if f.is_file()}


def test_cql_starts_from_a_bc_actor(tiny_dataset, tmp_path):
    train_bc(tiny_dataset, tmp_path / "bc", steps=20, **TINY)
    train_cql(tiny_dataset, tmp_path / "cql", steps=1, init_actor=tmp_path / "bc", **TINY)
    rec = read_config(tmp_path / "cql")
    assert rec["init_actor"]["algo"] == "bc" and rec["init_actor"]["keys"] >= 4
    assert list(rec) == ["algo", "config", "env", "dataset", "format_version", "preset", "init_actor"]
    assert rec["algo"] == "cql" and rec["format_version"] == 1


def test_resuming_reads_an_older_calql_record_by_its_critic_regime(tiny_dataset, tmp_path):
    """Fine-tuning and continual records written before a learner was named by its critic regime say
    ``calql``; a rerun of the same run, whose learner now says ``sac`` or ``cql``, still resumes it."""
    from arl_models.checkpoint import TRAIN_STATE, ResumeMismatch, check_resumable

    out = tmp_path / "run"
    (out / TRAIN_STATE).mkdir(parents=True)
    for regime, now in (("none", "sac"), ("cql", "cql"), ("calql", "calql")):
        old = {"algo": "calql", "config": {"conservative": regime}}
        (out / TRAIN_STATE / "state.json").write_text(json.dumps({"record": old}))
        check_resumable(out, {"algo": now, "config": {"conservative": regime}})
        with pytest.raises(ResumeMismatch, match="algo was"):
            check_resumable(out, {"algo": "iql", "config": {"conservative": regime}})


def test_observed_versions_condition_the_networks_from_bc_to_the_saved_policy(tmp_path):
    """A 2.x dataset (the plant in the last 3 entries) gets FiLM-conditioned networks by default; the
    checkpoint reloads them, a BC start must match, and 0 turns conditioning off."""
    from arl_models.data.dataset import write_dataset
    from tests.conftest import make_transitions, pendulum_info

    t = make_transitions(obs_dim=6)
    t.env_version[:] = "2.1.0"
    data = tmp_path / "v2.1.0"
    write_dataset(data, t, pendulum_info(env_version="2.1.0", obs_dim=6))
    train_bc(data, tmp_path / "bc", steps=5, **TINY)
    train_cql(data, tmp_path / "cql", steps=5, init_actor=tmp_path / "bc", **TINY)
    for stage in ("bc", "cql"):
        assert read_config(tmp_path / stage)["config"]["context_dim"] == 3
    assert read_config(tmp_path / "cql")["init_actor"]["keys"] >= 8  # the trunk's layers and FiLM weights too
    weights = _weights(tmp_path / "cql")
    assert {"actor.trunk.film.0", "actor.film", "critic.film.0", "cost_critic.film.2"} <= set(weights)
    obs = t.obs[:8].copy()
    obs[:, -1] = -2.0  # 2.1.0's actuator offset
    # load_policy builds the conditioned actor from the config; the strict load refuses any missing weight
    assert load_policy(tmp_path / "cql").act(obs).shape == (8, 1)
    # a checkpoint of the layout before the actor's output FiLM: the error names the checkpoint and the weight
    import shutil

    from safetensors.torch import save_file

    old = shutil.copytree(tmp_path / "cql", tmp_path / "old-layout")
    save_file({k: v for k, v in weights.items() if k != "actor.film"}, str(old / WEIGHTS))
    with pytest.raises(
        ValueError,
        match=r"old-layout: its weights do not fit .* \(missing \['actor.film'\], unexpected \[\]\)",
    ):
        load_policy(old)
    with pytest.raises(ValueError, match="conditioned on 3 context entries and this cql on 0"):
        train_cql(data, tmp_path / "plain", steps=1, init_actor=tmp_path / "bc", context_dim=0, **TINY)
    train_bc(data, tmp_path / "plain-bc", steps=1, context_dim=0, **TINY)
    assert read_config(tmp_path / "plain-bc")["config"]["context_dim"] == 0


def test_loading_refuses_a_directory_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing config.json"):
        load_policy(tmp_path)


def test_a_checkpoint_from_before_input_statistics_loads_and_warm_starts_on_raw_inputs(
    tiny_dataset, tmp_path
):
    train_bc(tiny_dataset, tmp_path / "bc", steps=2, preset="demo", progress=False, eval_episodes=0)
    weights = load_file(str(tmp_path / "bc" / WEIGHTS))
    save_file({k: v for k, v in weights.items() if ".obs_norm." not in k}, str(tmp_path / "bc" / WEIGHTS))
    old = load_policy(tmp_path / "bc").actor
    assert torch.equal(old.obs_norm.mean, torch.zeros(3)) and torch.equal(old.obs_norm.std, torch.ones(3))
    train_cql(
        tiny_dataset, tmp_path / "cql", steps=1, init_actor=tmp_path / "bc", preset="demo", progress=False
    )
    started = load_file(str(tmp_path / "cql" / "train_state" / "state.safetensors"))
    assert torch.equal(started["actor.obs_norm.std"], torch.ones(3))  # the BC actor's raw inputs
    assert not torch.equal(started["critic.obs_norm.std"], torch.ones(3))  # the critics', the data's
