"""Constrained online fine-tuning: the multiplier, the mixing ratio, warm start, Cal-QL and resume."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from arl_models.algos.calql import CalQL, CalQLConfig, MCBatch, mc_returns
from arl_models.checkpoint import read_config
from arl_models.envs.registry import get_task
from arl_models.lagrange import PIDConfig
from arl_models.online import (
    FinetuneConfig,
    OnlineWriter,
    Round,
    after_round,
    build_algo,
    finetune,
    make_envs,
    measured_cost,
    sample_mixed,
    steer,
    warm_start,
)
from arl_models.replay import ActionScaler, ReplayBuffer
from tests.online.conftest import saved_multiplier

TINY = FinetuneConfig(steps=800, num_envs=2, vector="sync", utd=0.05, eval_episodes=0, batch_size=32)


ASCENT = PIDConfig(kp=0.0, ki=0.01, kd=0.0)


def _algo_with_rounds(tiny_cql, tmp_path, costs, pid=ASCENT, margin=0.0):
    cfg = replace(TINY, pid=pid, cost_margin=margin)
    algo = build_algo(read_config(tiny_cql), cfg)
    warm_start(algo, tiny_cql, budget=12.0)
    values = [algo.lagrangian.value]
    for c in costs:
        rnd = Round(algo, cfg, None, OnlineWriter(ReplayBuffer(1, 3, 1), torch.zeros(1), 0.99))
        rnd.episodes = [(-100.0, c, 200), (-100.0, c, 200)]
        steer(algo, cfg, after_round(algo, _state(), rnd, 12.0, tmp_path), 12.0)
        values.append(algo.lagrangian.value)
    return values


def _state():
    from arl_models.online import OnlineState

    return OnlineState()


@pytest.mark.parametrize(
    "pid", [PIDConfig(kp=0.0, ki=0.01, kd=0.0), PIDConfig(kp=0.05, ki=0.01, kd=0.02)], ids=["ascent", "pid"]
)
def test_multiplier_rises_over_budget_and_falls_under(tiny_cql, tmp_path, pid):
    v = _algo_with_rounds(tiny_cql, tmp_path, [20.0, 30.0, 40.0, 8.0, 6.0, 4.0], pid)
    assert v[1] > v[0] and v[2] > v[1] and v[3] > v[2], v
    assert v[4] < v[3] and v[5] < v[4] and v[6] < v[5], v
    assert min(v) >= 0.0
    if pid.kp == pid.kd == 0.0:  # gradient ascent: lambda += ki * (cost / budget - 1)
        assert v[1] - v[0] == pytest.approx(0.01 * (20.0 / 12.0 - 1.0))


def test_cost_margin_holds_the_training_episodes_below_the_budget(tiny_cql, tmp_path):
    """Episodes at 11 against a budget of 12: under the budget, over the 0.2 margin's setpoint of 9.6."""
    plain = _algo_with_rounds(tiny_cql, tmp_path, [11.0, 11.0], margin=0.0)
    held = _algo_with_rounds(tiny_cql, tmp_path, [11.0, 11.0], margin=0.2)
    assert held[2] > held[1] > held[0], held
    assert held[1] - held[0] == pytest.approx(0.01 * (11.0 / 12.0 - 0.8))
    assert plain[0] >= plain[1] >= plain[2], plain  # falls (or stays at 0) without the margin
    with pytest.raises(ValueError, match="cost_margin"):
        finetune(tiny_cql, tmp_path / "bad", config=replace(TINY, cost_margin=1.0), progress=False)


def test_the_multiplier_steers_the_evaluated_policy_where_the_round_has_an_evaluation(tiny_cql, tmp_path):
    """The training episodes sample their actions; the policy a run hands over acts deterministically and
    can pay more. With ``cost_signal="evaluation"`` the multiplier measures the evaluation's cost, the
    episodes' in rounds without one; by default the episodes'."""
    cheap_episodes = {"online/episode_cost": 2.0}
    costly_policy = cheap_episodes | {"eval/cost": 20.0}
    by_evaluation = replace(TINY, cost_signal="evaluation")
    assert measured_cost(by_evaluation, costly_policy) == 20.0
    assert measured_cost(by_evaluation, cheap_episodes) == 2.0
    assert measured_cost(TINY, costly_policy) == 2.0
    for cfg, rises in ((replace(by_evaluation, pid=ASCENT), True), (replace(TINY, pid=ASCENT), False)):
        algo = build_algo(read_config(tiny_cql), cfg)
        warm_start(algo, tiny_cql, budget=12.0)
        metrics = dict(costly_policy)
        steer(algo, cfg, metrics, 12.0)
        assert (metrics["online/lagrange_multiplier"] > 0.0) == rises, (cfg.cost_signal, metrics)
    with pytest.raises(ValueError, match="cost_signal"):
        finetune(tiny_cql, tmp_path / "bad", config=replace(TINY, cost_signal="stochastic"), progress=False)


def test_the_online_multiplier_starts_afresh_whatever_the_offline_one_ended_at(tiny_cql, tmp_path):
    """Offline the multiplier weighed ``Q_c`` at the episode starts; online it weighs the episodes' cost."""
    with saved_multiplier(tiny_cql, 0.7):
        algo = build_algo(read_config(tiny_cql), TINY)
        previous = warm_start(algo, tiny_cql, budget=12.0)
    assert previous["value"] == 0.7
    assert algo.lagrangian.state() == {"integral": 0.0, "prev": 0.0, "value": 0.0}
    assert algo.lagrangian.cfg == TINY.pid


def test_the_unconstrained_baseline_neither_applies_nor_reports_a_multiplier(
    tiny_cql, pendulum_data, tmp_path
):
    free = replace(TINY, constrained=False)
    with saved_multiplier(tiny_cql, 0.7):
        algo = build_algo(read_config(tiny_cql), free)
        warm_start(algo, tiny_cql, budget=12.0)
        final = finetune(tiny_cql, tmp_path / "free", data=pendulum_data, config=free, progress=False)
    obs = torch.randn(16, 3)
    losses = []
    for value in (0.7, 0.0):
        algo.lagrangian.value = value
        torch.manual_seed(0)
        losses.append(algo.actor_loss(obs)[0].item())
    assert losses[0] == losses[1]
    eps = [json.loads(ln) for ln in (tmp_path / "free" / "episodes.jsonl").read_text().splitlines()]
    assert [e["multiplier"] for e in eps] == [0.0] * len(eps) and final["online/lagrange_multiplier"] == 0.0


def test_warm_start_loads_actor_and_both_critics(tiny_cql):
    algo = build_algo(read_config(tiny_cql), TINY)
    warm_start(algo, tiny_cql, budget=12.0)
    w = load_file(str(tiny_cql / "weights.safetensors"))
    for name in ("actor", "critic", "cost_critic"):
        for k, v in algo.networks()[name].state_dict().items():
            assert torch.equal(v, w[f"{name}.{k}"]), f"{name}.{k}"


def _buffers(n_off=100, n_on=60):
    off, on = ReplayBuffer(n_off, 3, 1), ReplayBuffer(n_on, 3, 1)
    for buf, n, c in ((off, n_off, 0.0), (on, n_on, 1.0)):
        z = np.zeros(n, np.float32)
        buf.add(
            obs=np.zeros((n, 3)), act=np.zeros((n, 1)), rew=z, cost=z + c, next_obs=np.zeros((n, 3)), done=z
        )
    return off, on


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 0.7, 1.0])
@pytest.mark.parametrize("batch_size", [32, 256, 257])
def test_mixing_ratio_is_exact(ratio, batch_size):
    off, on = _buffers()
    for _ in range(5):
        b = sample_mixed(off, on, batch_size, ratio, torch.full((100,), 3.0), torch.full((60,), 4.0))
        n_off = round(ratio * batch_size)
        assert b.obs.shape[0] == batch_size
        assert int((b.cost == 0).sum()) == n_off and int((b.cost == 1).sum()) == batch_size - n_off
        assert torch.equal(b.mc_return == 3.0, b.cost == 0)  # MC returns travel with their rows


def test_mc_returns_restart_at_episode_ends():
    g = mc_returns(np.ones(5, np.float32), np.array([0, 1, 0, 0, 1], bool), 0.5)
    np.testing.assert_allclose(g, [1.5, 1.0, 1.75, 1.5, 1.0])


def _mc_returns_loop(rew, episode_end, gamma):
    """The straightforward definition: back to front, restarting at each episode's last row."""
    out, g = np.zeros(len(rew)), 0.0
    for i in range(len(rew) - 1, -1, -1):
        g = float(rew[i]) + gamma * (0.0 if episode_end[i] else g)
        out[i] = g
    return out.astype(np.float32)


@pytest.mark.parametrize("gamma", [0.0, 0.9, 0.99])
def test_mc_returns_equal_the_loop(gamma):
    """Episodes of random lengths (1 to 700 rows), ending by termination or truncation as
    ``offline_buffer`` marks them, the last one cut off by the end of the rows; and short arrays."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 700, size=40)
    ids = np.repeat(np.arange(len(lengths)), lengths)
    terminated = rng.uniform(size=len(ids)) < 0.002
    truncated = np.r_[ids[1:] != ids[:-1], False]  # the last episode has no end in the rows
    ends = terminated | truncated
    rew = rng.normal(size=len(ids)).astype(np.float32)
    np.testing.assert_allclose(
        mc_returns(rew, ends, gamma), _mc_returns_loop(rew, ends, gamma), rtol=1e-6, atol=1e-6
    )
    for n in (0, 1, 2, 31, 33, 1025):
        r, e = rew[:n], ends[:n]
        np.testing.assert_allclose(
            mc_returns(r, e, gamma), _mc_returns_loop(r, e, gamma), rtol=1e-6, atol=1e-6
        )


def _rows(rew):
    n = len(rew)
    z = np.zeros(n, np.float32)
    return {
        "obs": np.zeros((n, 3)),
        "act": np.zeros((n, 1)),
        "rew": np.asarray(rew, np.float32),
        "cost": z,
        "next_obs": np.zeros((n, 3)),
        "done": z,
    }


def test_the_writer_fills_each_environments_return_when_its_episode_ends():
    w = OnlineWriter(ReplayBuffer(8, 3, 1), torch.zeros(8), gamma=0.5)
    for a, b, a_ends in (
        (1.0, 10.0, False),
        (1.0, 20.0, False),
        (1.0, 30.0, True),
    ):  # two environments, interleaved
        n = w.add(_rows([a, b]))
        w.extend("a", n[:1], np.array([a]), np.array([a_ends]))
        w.extend("b", n[1:], np.array([b]), np.array([False]))
    np.testing.assert_allclose(
        w.mc[:6].numpy(), [1.75, -np.inf, 1.5, -np.inf, 1.0, -np.inf]
    )  # b is still open
    w.extend("b", w.add(_rows([40.0])), np.array([40.0]), np.array([True]))
    np.testing.assert_allclose(w.mc[[1, 3, 5, 6]].numpy(), [10 + 10 + 7.5 + 5, 20 + 15 + 10, 30 + 20, 40])


def test_a_row_the_ring_overwrote_before_its_episode_ended_gets_no_return():
    w = OnlineWriter(ReplayBuffer(3, 3, 1), torch.zeros(3), gamma=1.0)
    w.extend("a", w.add(_rows([1.0, 1.0])), np.ones(2), np.zeros(2, bool))
    w.extend(
        "b", w.add(_rows([5.0, 5.0])), np.full(2, 5.0), np.array([False, True])
    )  # overwrites a's first row
    assert w.mc.tolist() == [5.0, -np.inf, 10.0]  # slot 0 now holds b's second row
    w.extend(
        "a", w.add(_rows([1.0])), np.ones(1), np.ones(1, bool)
    )  # a ends (3, 2, 1): only its last row is still held
    assert w.mc.tolist() == [5.0, 1.0, 10.0]


def test_each_step_reaches_the_replay_before_the_next_update(tiny_cql):
    """Stored the step it happens, not at its episode's end: the update after step t can draw it."""
    cfg = replace(TINY, utd=1.0)
    algo = build_algo(read_config(tiny_cql), cfg)
    env = read_config(tiny_cql)["env"]
    w = OnlineWriter(ReplayBuffer(1000, 3, 1), torch.zeros(1000), algo.cfg.gamma)
    seen = []

    def update():
        seen.append((len(w.online), bool(torch.isinf(w.mc[: len(w.online)]).all())))
        return {}

    envs = make_envs(get_task("safe-pendulum"), cfg)
    try:
        Round(algo, cfg, ActionScaler.of(env["action_low"], env["action_high"]), w).run(envs, 0, update)
    finally:
        envs.close()
    assert [n for n, _ in seen] == [
        2 * (t // 2 + 1) for t in range(400)
    ]  # two environments, two updates a step
    assert all(unknown for _, unknown in seen[:-2]) and not any(unknown for _, unknown in seen[-2:])
    rows = w.online.data
    for i in range(2):  # rows interleave the two environments; each has its episode's own return
        ends = np.zeros(200, bool)
        ends[-1] = True
        g = mc_returns(rows["rew"][i:400:2].numpy(), ends, algo.cfg.gamma)
        np.testing.assert_allclose(w.mc[i:400:2].numpy(), g, rtol=1e-6)


def test_calql_bounds_policy_action_values_by_mc_return():
    algo = CalQL(3, 1, CalQLConfig(hidden=(8,), n_action_samples=2))
    q = torch.full((2, 4, 6), -10.0)
    b = MCBatch(
        *(
            torch.zeros(4, 3),
            torch.zeros(4, 1),
            torch.zeros(4),
            torch.zeros(4),
            torch.zeros(4, 3),
            torch.zeros(4),
        ),
        mc_return=torch.tensor([-1.0, -20.0, 0.0, -5.0]),
    )
    out = algo.bound_sampled_q(q, b)
    assert torch.equal(out[..., :2], q[..., :2])  # uniform actions untouched
    np.testing.assert_allclose(
        out[0, :, 2:].numpy(), np.array([[-1.0] * 4, [-10.0] * 4, [0.0] * 4, [-5.0] * 4])
    )


@pytest.mark.parametrize("mode", ["none", "cql", "calql"])
def test_each_critic_regime_updates_finitely(mode):
    algo = CalQL(
        3, 1, CalQLConfig(hidden=(8,), n_action_samples=2, conservative=mode, external_multiplier=True)
    )
    algo.lagrangian.value = 1.0
    off, on = _buffers()
    m = algo.update(sample_mixed(off, on, 32, 0.5, torch.zeros(100), torch.zeros(60)))
    assert all(np.isfinite(v) for v in m.values()) and m["lagrange_multiplier"] == 1.0


def test_finetune_writes_checkpoint_and_cost_records(tiny_cql, pendulum_data, tmp_path):
    out = tmp_path / "ft"
    final = finetune(tiny_cql, out, data=pendulum_data, config=TINY, progress=False)
    assert (out / "weights.safetensors").is_file() and (out / "metrics.json").is_file()
    eps = [json.loads(ln) for ln in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(eps) == 4 and eps[-1]["env_steps"] == 800
    assert eps[-1]["cumulative_cost"] == pytest.approx(sum(e["cost"] for e in eps))
    assert final["online/cumulative_cost"] == pytest.approx(eps[-1]["cumulative_cost"])
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"online/episode_cost", "online/lagrange_multiplier", "online/q_data", "online/qc_policy"} <= set(
        rows[-1]
    )
    record = read_config(out)
    assert record["stage"] == "finetune" and record["algo"] == "sac"  # conservative "none": SAC
    assert list(record) == [
        "algo",
        "config",
        "env",
        "dataset",
        "format_version",
        "stage",
        "from",
        "finetune",
        "start_multiplier",
        "initial_eval",
    ]


@pytest.mark.parametrize(("mode", "name"), [("none", "sac"), ("cql", "cql"), ("calql", "calql")])
def test_a_learner_is_named_by_its_critic_regime(tiny_cql, mode, name):
    algo = build_algo(read_config(tiny_cql), replace(TINY, conservative=mode))
    assert algo.name == name and algo.cfg.conservative == mode


def _as_recorded_before_regime_names(out):
    """Rewrite a fine-tuning checkpoint's records as they were written before a learner was named by its
    critic regime: ``calql`` whatever the regime (the only difference of those checkpoints)."""
    for f in (out / "config.json", out / "train_state" / "state.json"):
        meta = json.loads(f.read_text())
        rec = meta if f.name == "config.json" else meta["record"]
        rec["algo"] = "calql"
        f.write_text(json.dumps(meta))


def test_a_checkpoint_recorded_as_calql_resumes_and_starts_the_next_stage(tiny_cql, pendulum_data, tmp_path):
    cfg = replace(TINY, steps=1200)
    finetune(tiny_cql, tmp_path / "a", data=pendulum_data, config=cfg, progress=False)
    finetune(tiny_cql, tmp_path / "b", data=pendulum_data, config=cfg, progress=False, stop_after_rounds=1)
    _as_recorded_before_regime_names(tmp_path / "b")
    finetune(tiny_cql, tmp_path / "b", data=pendulum_data, config=cfg, progress=False)
    wa = load_file(str(tmp_path / "a" / "train_state" / "state.safetensors"))
    wb = load_file(str(tmp_path / "b" / "train_state" / "state.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert read_config(tmp_path / "b")["algo"] == "calql"  # a resumed run keeps the record it began with
    algo = build_algo(read_config(tmp_path / "b"), TINY)
    warm_start(algo, tmp_path / "b", budget=12.0)
    assert all(torch.equal(v, wb[f"actor.{k}"]) for k, v in algo.actor.state_dict().items())
    assert algo.name == "sac"


def test_a_run_killed_before_its_config_was_written_resumes(tiny_cql, pendulum_data, tmp_path):
    """The train state is renamed into place before ``config.json`` is rewritten: a kill in between
    leaves a train state without a config, and the record kept with the train state resumes it."""
    cfg = replace(TINY, steps=1200)
    out = tmp_path / "ft"
    finetune(tiny_cql, out, data=pendulum_data, config=cfg, progress=False, stop_after_rounds=1)
    (out / "config.json").unlink()
    final = finetune(tiny_cql, out, data=pendulum_data, config=cfg, progress=False)
    assert final["online/env_steps_total"] == 1200 and read_config(out)["stage"] == "finetune"


def test_the_final_evaluation_is_logged_with_the_others(tiny_cql, pendulum_data, tmp_path):
    """A run whose last round had no evaluation evaluates once more at the end; that evaluation is on the
    curve too, not only in ``metrics.json`` (benchmarks read the last evaluations from the curve)."""
    out = tmp_path / "ft"
    final = finetune(
        tiny_cql,
        out,
        data=pendulum_data,
        config=replace(TINY, steps=1200, eval_episodes=2, eval_every=2),
        progress=False,
    )
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/return" in r]
    assert [r["step"] for r in evals] == [800, 1200], (
        "three rounds of 400 steps: the second round's and the final one"
    )
    assert evals[-1]["eval/return"] == final["eval/return"] and evals[-1]["eval/cost"] == final["eval/cost"]


@pytest.mark.parametrize("preprocess", ["none", "amplitude"])
def test_resume_after_interrupt_gives_the_same_weights(tiny_cql, pendulum_data, tmp_path, preprocess):
    cfg = replace(TINY, steps=1200, preprocess=preprocess)
    finetune(tiny_cql, tmp_path / "a", data=pendulum_data, config=cfg, progress=False)
    finetune(tiny_cql, tmp_path / "b", data=pendulum_data, config=cfg, progress=False, stop_after_rounds=1)
    assert json.loads((tmp_path / "b" / "episodes.jsonl").read_text().splitlines()[-1])["env_steps"] == 400
    finetune(tiny_cql, tmp_path / "b", data=pendulum_data, config=cfg, progress=False)
    wa = load_file(str(tmp_path / "a" / "train_state" / "state.safetensors"))
    wb = load_file(str(tmp_path / "b" / "train_state" / "state.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k  # weights, optimisers, online replay, counters
    assert (tmp_path / "a" / "episodes.jsonl").read_text() == (tmp_path / "b" / "episodes.jsonl").read_text()
    # asked again, the finished run is left as it is (no extra evaluation, no rewritten record)
    files = {f: f.read_bytes() for f in (tmp_path / "b").rglob("*") if f.is_file()}
    again = finetune(tiny_cql, tmp_path / "b", data=pendulum_data, config=cfg, progress=False)
    assert again == json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert files == {f: f.read_bytes() for f in (tmp_path / "b").rglob("*") if f.is_file()}


def test_cli_finetune_with_worker_processes(tiny_cql, pendulum_data, tmp_path):
    from arl_cli.online import app

    out = tmp_path / "cli"
    res = CliRunner().invoke(
        app,
        [
            "finetune",
            "--from",
            str(tiny_cql),
            "--out",
            str(out),
            "--task",
            "safe-pendulum",
            "--steps",
            "400",
            "--num-envs",
            "2",
            "--data",
            str(pendulum_data),
            "--eval-episodes",
            "0",
            "--utd",
            "0.05",
            "--vector",
            "async",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output[res.output.index("{\n") :])["online/env_steps_total"] == 400
    assert (out / "train_state").is_dir()


def test_preprocessing_runs_on_every_training_batch_and_the_replay_stays_raw(
    tiny_cql, pendulum_data, tmp_path
):
    from arl_models.preprocess import PREPROCESSORS, register_preprocessor

    seen: list[float] = []

    class Shift:  # an unmistakable transform: observations moved by 1000
        def __init__(self, stats, scale):
            self.scale = scale

        def __call__(self, batch):
            seen.append(float(batch.obs.abs().max()))
            return replace(batch, obs=batch.obs + self.scale, next_obs=batch.next_obs + self.scale)

    register_preprocessor("shift-test", Shift)
    try:
        cfg = replace(TINY, preprocess="shift-test", preprocess_scale=1000.0)
        final = finetune(tiny_cql, tmp_path / "ft", data=pendulum_data, config=cfg, progress=False)
    finally:
        del PREPROCESSORS["shift-test"]
    assert len(seen) == final["online/updates"] > 0
    assert max(seen) <= 8.0 + 1e-5  # it is given raw observations (pendulum: |obs| <= 8) ...
    state = load_file(str(tmp_path / "ft" / "train_state" / "state.safetensors"))
    assert state["replay.obs"].abs().max() <= 8.0 + 1e-5  # ... and the replay keeps them raw
    finetune(tiny_cql, tmp_path / "plain", data=pendulum_data, config=TINY, progress=False)
    plain = load_file(str(tmp_path / "plain" / "train_state" / "state.safetensors"))
    critic = [k for k in state if k.startswith("critic") and "weight" in k][0]
    assert not torch.equal(
        plain[critic], state[critic]
    )  # the same seeds, other weights: the updates saw the transform


def test_finetune_refuses_data_labelled_by_another_cost(tiny_cql, pendulum_data, tmp_path):
    """A dataset records the cost function that labelled it; fine-tuning would mix it with the env's."""
    import shutil

    from arl_models.envs.registry import get_task

    stale = tmp_path / "stale"
    shutil.copytree(pendulum_data, stale)
    sidecar = stale / "dataset.json"
    meta = json.loads(sidecar.read_text())
    meta["extra"]["cost_fn"] = "ActuatorEffortCost(threshold=1.0, ramp=None)"
    sidecar.write_text(json.dumps(meta))
    with pytest.raises(
        ValueError,
        match=r"stale: its cost column was computed by ActuatorEffortCost\(threshold=1.0, ramp=None\)",
    ):
        finetune(tiny_cql, tmp_path / "ft", data=stale, config=TINY, progress=False)
    assert not (tmp_path / "ft" / "train_state").exists()
    meta["extra"]["cost_fn"] = repr(get_task("safe-pendulum").cost_fn)  # the task's own: accepted
    sidecar.write_text(json.dumps(meta))
    finetune(tiny_cql, tmp_path / "ok", data=stale, config=TINY, progress=False, stop_after_rounds=1)
