"""EWC: the Fisher of a known Gaussian policy, the penalty's shape, and continual training end to end."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from arl_models.algos.calql import CalQL, CalQLConfig
from arl_models.algos.ewc import (
    NETWORKS,
    EWCConfig,
    EWCPenalty,
    compute_fisher,
    critic_fisher,
    current_anchor,
    policy_fisher,
)
from arl_models.continual import ContinualConfig, batches, earlier_buffer, offline_start, train_continual
from arl_models.data.dataset import read_dataset
from arl_models.nets import EnsembleCritic, TanhGaussianActor
from arl_models.replay import ActionScaler, ReplayBuffer
from tests.online.conftest import saved_multiplier, write_pendulum_data


def _gaussian_actor():
    torch.manual_seed(0)
    actor = TanhGaussianActor(2, 1, (4,))
    with torch.no_grad():
        actor.log_std.bias.fill_(-0.7)
        actor.log_std.weight.mul_(0.1)
        actor.mu.weight.mul_(0.3)
    return actor


def test_policy_fisher_matches_the_gaussian_closed_form():
    """For N(mu(s), sigma(s)^2) with mu = W h + b, log sigma = V h + c (tanh changes no parameter term):
    F[W] = E[h^2 / sigma^2], F[b] = E[1 / sigma^2], F[V] = 2 E[h^2], F[c] = 2."""
    actor = _gaussian_actor()
    obs = torch.randn(20_000, 2)
    f = policy_fisher(actor, obs, chunk=5_000)
    with torch.no_grad():
        h = actor.trunk(obs)
        _, log_std = actor.dist_params(obs)
        var = (2 * log_std).exp()
    torch.testing.assert_close(f["mu.weight"][0], (h**2 / var).mean(0), rtol=0.06, atol=1e-3)
    torch.testing.assert_close(f["mu.bias"][0], (1 / var).mean(), rtol=0.06, atol=1e-3)
    torch.testing.assert_close(f["log_std.weight"][0], 2 * (h**2).mean(0), rtol=0.15, atol=1e-3)
    torch.testing.assert_close(f["log_std.bias"][0], torch.tensor(2.0), rtol=0.15, atol=0.0)


def test_critic_fisher_of_a_linear_critic_is_its_squared_input():
    critic = EnsembleCritic(2, 1, (), ensemble=2)  # Q_e = w_e . [s, a] + b_e
    obs, act = torch.randn(500, 2), torch.rand(500, 1)
    f = critic_fisher(critic, obs, act)
    x = torch.cat([obs, act], 1)
    for e in range(2):
        torch.testing.assert_close(f["out.weight"][e, :, 0], (x**2).mean(0))
    torch.testing.assert_close(f["out.bias"], torch.ones(2, 1, 1))


def test_penalty_is_zero_at_the_anchor_and_grows_quadratically():
    algo = CalQL(3, 1, CalQLConfig(hidden=(8,)))
    cfg = EWCConfig(samples=64, networks=NETWORKS)
    obs, act = torch.randn(64, 3), torch.rand(64, 1) * 2 - 1
    pen = EWCPenalty(compute_fisher(algo, obs, act, cfg), current_anchor(algo, cfg.networks), weight=3.0)
    assert set(k.split(".")[0] for k in pen.fisher) == {"actor", "critic", "cost_critic"}
    assert pen.penalty("actor", algo.actor).item() == 0.0
    torch.manual_seed(1)
    direction = {k: torch.randn_like(p) for k, p in algo.actor.named_parameters()}
    values = []
    for eps in (0.01, 0.02, 0.04):
        with torch.no_grad():
            for k, p in algo.actor.named_parameters():
                p.copy_(pen.anchor[f"actor.{k}"] + eps * direction[k])
        values.append(pen.penalty("actor", algo.actor).item())
    assert values[0] > 0
    assert values[1] / values[0] == pytest.approx(4.0, rel=1e-3) and values[2] / values[1] == pytest.approx(
        4.0, rel=1e-3
    )


def test_online_ewc_decays_the_accumulated_fisher():
    a = {"actor.w": torch.ones(3)}
    pen = EWCPenalty({"actor.w": torch.full((3,), 2.0)}, a, 1.0).consolidate(
        {"actor.w": torch.ones(3)}, a, decay=0.5
    )
    torch.testing.assert_close(pen.fisher["actor.w"], torch.full((3,), 2.0))
    again = EWCPenalty.from_tensors(pen.tensors(), 1.0)
    torch.testing.assert_close(again.fisher["actor.w"], pen.fisher["actor.w"])


def test_penalty_gradient_reaches_only_the_penalised_network():
    algo = CalQL(3, 1, CalQLConfig(hidden=(8,)))
    anchor = current_anchor(algo, ("actor",))
    with torch.no_grad():
        for p in algo.actor.parameters():
            p.add_(0.1)
    algo.regularizer = EWCPenalty({k: torch.ones_like(v) for k, v in anchor.items()}, anchor, 1.0)
    loss, _, _ = algo.actor_loss(torch.randn(8, 3))
    loss.backward()
    assert all(p.grad is None for p in algo.critic.parameters())
    assert algo.actor.mu.bias.grad is not None


def test_fisher_leaves_the_modulation_rows_of_unvaried_plant_entries_free():
    """With FiLM, the Fisher of a row of ``W`` is zero on data whose context entry is 0 (the nominal plant,
    or a version that varies other entries): EWC holds the shared weights and leaves that row to a later
    version that varies it (2.1.0's actuator, 2.2.0's mass)."""
    algo = CalQL(5, 1, CalQLConfig(hidden=(8,), context_dim=2))
    obs, act = torch.randn(32, 5), torch.rand(32, 1) * 2 - 1
    obs[:, -2] = 0.0  # the first context entry at nominal, the second varied
    fisher = compute_fisher(algo, obs, act, EWCConfig(networks=NETWORKS))
    film = {k: v for k, v in fisher.items() if "film" in k.split(".")}
    assert set(film) == {
        f"{n}.film.{i}" for n in ("actor.trunk", "critic", "cost_critic") for i in (0, 1)
    } | {"actor.film"}
    for k, f in film.items():
        rows = f[..., 0, :], f[..., 1, :]  # (k, 2D) for the actor, (E, k, 2D) for the critics
        assert torch.count_nonzero(rows[0]) == 0 and torch.count_nonzero(rows[1]) > 0, k


def test_fisher_of_the_actor_alone_by_default_and_unknown_networks_are_named():
    algo = CalQL(3, 1, CalQLConfig(hidden=(8,)))
    obs, act = torch.randn(16, 3), torch.rand(16, 1) * 2 - 1
    fisher = compute_fisher(algo, obs, act, EWCConfig())
    assert fisher and all(k.startswith("actor.") for k in fisher)
    with pytest.raises(ValueError, match=r"unknown networks \['policy'\]"):
        EWCConfig(networks=("actor", "policy"))


def test_continual_reports_scores_and_forgetting_for_ewc_and_naive(tiny_cql, pendulum_data, tmp_path):
    new = write_pendulum_data(tmp_path / "v1.1.0", version="1.1.0", seed=1)
    cfg = ContinualConfig(
        steps=10, ewc=EWCConfig(samples=32), rehearsal=0.5, eval_episodes=1, log_every=5, eval_every=5
    )
    report = train_continual(
        tiny_cql, new, tmp_path / "cl", previous=[pendulum_data], config=cfg, progress=False
    )
    assert report["config"]["rehearsal"] == 0.5
    for branch in (tmp_path / "cl", tmp_path / "cl" / "naive"):  # both learning curves, on every version
        rows = [json.loads(line) for line in (branch / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [5, 10]
        assert all(
            np.isfinite(r[f"eval/safe-pendulum@{v}/normalized_score"])
            for r in rows
            for v in ("1.0.0", "1.1.0")
        )
    for name in ("ewc", "naive"):
        r = report[name]
        assert r["versions"] == ["safe-pendulum@1.0.0", "safe-pendulum@1.1.0"]
        assert set(r["forgetting"]) == {"safe-pendulum@1.0.0"}
        k = "safe-pendulum@1.0.0"
        assert r["forgetting"][k] == pytest.approx(r["best_earlier"][k] - r["scores"][k])
        assert np.isfinite(r["new_score"])
    assert (tmp_path / "cl" / "ewc.safetensors").is_file() and not (
        tmp_path / "cl" / "naive" / "ewc.safetensors"
    ).exists()
    record = json.loads((tmp_path / "cl" / "config.json").read_text())
    assert record["algo"] == "cql"  # offline CQL on the new data, with the penalty
    assert list(record)[:9] == [
        "algo",
        "config",
        "env",
        "dataset",
        "format_version",
        "stage",
        "from",
        "ewc",
        "continual_config",
    ]
    chain = record["continual"]
    assert chain["datasets"] == [str(pendulum_data), str(new)]
    assert (
        json.loads((tmp_path / "cl" / "continual.json").read_text())["ewc"]["new_version"]
        == "safe-pendulum@1.1.0"
    )


def test_continual_holds_the_new_data_with_the_offline_gains_and_a_fresh_multiplier(tiny_cql, pendulum_data):
    """The champion's multiplier weighed its episodes' cost online: the new data's limit on ``Q_c`` gets the
    offline gains and a multiplier at rest."""
    t, info = read_dataset(pendulum_data)
    with saved_multiplier(tiny_cql, 0.7):
        algo = offline_start(tiny_cql, t, info)
    assert algo.lagrangian.state() == {"integral": 0.0, "prev": 0.0, "value": 0.0}
    assert algo.cfg.pid == CalQLConfig().pid and algo.cfg.cost_q_limit is not None


def test_forgetting_is_measured_against_the_policy_the_start_hands_over(tiny_cql, pendulum_data, tmp_path):
    """A fine-tuned start serves ``best/``: the chain's earlier scores are that policy's, while training
    continues from the start's own weights."""
    import shutil

    from arl_models.checkpoint import read_config, save_policy
    from arl_models.continual import score_on

    start = tmp_path / "start"
    shutil.copytree(tiny_cql, start)
    rec = read_config(start)
    torch.manual_seed(1)
    save_policy(start / "best", TanhGaussianActor(3, 1, tuple(rec["config"]["hidden"])), rec)
    new = write_pendulum_data(tmp_path / "v1.1.0", version="1.1.0", seed=1)
    cfg = ContinualConfig(steps=5, ewc=EWCConfig(samples=32), eval_episodes=1, baseline=False)
    report = train_continual(
        start, new, tmp_path / "cl", previous=[pendulum_data], config=cfg, progress=False
    )
    old = read_dataset(pendulum_data)[1]
    served, own = score_on(start / "best", old, 1), score_on(start, old, 1)
    assert served != own
    assert report["ewc"]["start_scores"]["safe-pendulum@1.0.0"] == served
    assert read_config(tmp_path / "cl")["from"] == str(start)
    # the new version is evaluated once: its score and its mean cost come from the same episodes
    from arl_models.continual import evaluate_on

    res = evaluate_on(tmp_path / "cl", read_dataset(new)[1], 1)
    assert report["ewc"]["new_cost"] == res.mean_cost and report["ewc"]["cost_budget"] == res.cost_budget


def test_rehearsal_batches_hold_the_earlier_versions_at_the_exact_share(pendulum_data, tmp_path):
    new = write_pendulum_data(tmp_path / "v1.1.0", version="1.1.0", seed=1)
    t_new, info = read_dataset(new)
    t_old, _ = read_dataset(pendulum_data)
    earlier = earlier_buffer([pendulum_data, pendulum_data], info)
    assert len(earlier) == 2 * len(t_old)
    torch.testing.assert_close(earlier.rows[: len(t_old), : info.obs_dim], torch.tensor(t_old.obs))
    assert earlier.data["act"].abs().max() <= 1.0  # actions normalised to the networks' range
    sample = batches(
        ReplayBuffer.from_transitions(t_new, ActionScaler(np.float32([-2.0]), np.float32([2.0]))),
        earlier,
        40,
        0.25,
    )
    old_obs = {tuple(o) for o in t_old.obs.tolist()}
    for _ in range(3):
        from_old = [tuple(o) in old_obs for o in sample().obs.tolist()]
        assert from_old == [True] * 10 + [False] * 30  # the datasets share no observation


def test_rehearsal_names_a_dataset_that_does_not_fit_and_a_share_out_of_range(pendulum_data, tmp_path):
    _, info = read_dataset(pendulum_data)
    with pytest.raises(ValueError, match=r"rehearsal: .*v1.0.0 has observations of 3 .* 5"):
        earlier_buffer([pendulum_data], replace(info, obs_dim=5))
    with pytest.raises(ValueError, match=r"rehearsal is a share of the batch in \[0, 1\), got 1.0"):
        ContinualConfig(rehearsal=1.0)
    with pytest.raises(ValueError, match=r"eval_every \(700\) must be a multiple of log_every \(500\)"):
        ContinualConfig(eval_every=700)
