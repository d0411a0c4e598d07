"""TD3+BC, IQL and ReBRAC: finite updates, what moves, what each loss touches, determinism, warm start,
resume; and BC's clipped-Gaussian likelihood on actions saturated at the bounds."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from arl_models.algos.bc import BC, BCConfig, clipped_gaussian_log_prob, compute_bc_loss
from arl_models.algos.iql import IQL, IQLConfig, expectile_loss
from arl_models.algos.rebrac import ReBRAC, ReBRACConfig
from arl_models.algos.td3bc import TD3BC, TD3BCConfig
from arl_models.checkpoint import load_policy, read_config
from arl_models.data.dataset import read_dataset
from arl_models.lagrange import PIDConfig
from arl_models.nets import OBS_STD_FLOOR, TanhGaussianActor, obs_standardization
from arl_models.offline import train_bc, train_offline_algo
from arl_models.replay import ActionScaler, ReplayBuffer
from arl_models.train import fit
from tests.conftest import make_transitions

SMALL = dict(hidden=(16, 16), batch_size=32)
TINY = dict(preset="demo", progress=False, eval_episodes=0)


def make_buffer() -> ReplayBuffer:
    """``conftest.make_buffer`` with the data's next actions, which ReBRAC needs and the others ignore."""
    scaler = ActionScaler(np.array([-2.0], np.float32), np.array([2.0], np.float32))
    return ReplayBuffer.from_transitions(make_transitions(), scaler, next_actions=True)


def _algos():
    return [
        TD3BC(3, 1, TD3BCConfig(**SMALL, policy_freq=1)),
        TD3BC(3, 1, TD3BCConfig(**SMALL, policy_freq=1, cost_q_limit=0.1, context_dim=1)),
        IQL(3, 1, IQLConfig(**SMALL)),
        IQL(3, 1, IQLConfig(**SMALL, cost_q_limit=0.1, context_dim=1)),
        ReBRAC(3, 1, ReBRACConfig(**SMALL, policy_freq=1)),
        ReBRAC(3, 1, ReBRACConfig(**SMALL, policy_freq=1, cost_q_limit=0.1, context_dim=1)),
    ]


@pytest.mark.parametrize(
    "algo", _algos(), ids=lambda a: f"{a.name}{'-constrained' if a.cfg.cost_q_limit else ''}"
)
def test_update_is_finite_and_moves_every_trained_network(algo):
    buf = make_buffer()
    before = {
        f"{n}.{k}": v.clone() for n, net in algo.networks().items() for k, v in net.state_dict().items()
    }
    for _ in range(3):
        metrics = algo.update(buf.sample(32))
    assert metrics and all(np.isfinite(v) for v in metrics.values()), metrics
    after = {f"{n}.{k}": v for n, net in algo.networks().items() for k, v in net.state_dict().items()}
    film = [
        k for k in before if ".film" in k
    ]  # FiLM moves only with a non-zero context: make_buffer's is random
    for k, v in before.items():
        if ".obs_norm." in k:  # fixed statistics, set from a dataset
            continue
        assert not torch.equal(v, after[k]) or k in film and not algo.cfg.context_dim, f"{k} did not move"
    if algo.cfg.cost_q_limit is not None:
        assert "lagrange_multiplier" in metrics


def test_td3bc_actor_step_leaves_critics_without_gradient_and_delays_the_actor():
    algo = TD3BC(3, 1, TD3BCConfig(**SMALL))  # policy_freq 2
    batch = make_buffer().sample(32)
    loss, _, _ = algo.actor_loss(batch)
    loss.backward()
    assert all(p.grad is None for p in algo.critic.parameters())
    assert all(p.grad is None for p in algo.cost.critic.parameters())
    assert algo.actor.mu.weight.grad is not None
    actor_before = algo.actor.mu.weight.detach().clone()
    algo.actor_opt.zero_grad(set_to_none=True)
    m = algo.update(batch)
    assert "loss_actor" not in m and torch.equal(
        actor_before, algo.actor.mu.weight
    )  # step 1 of 2: critics only
    m = algo.update(batch)
    assert "loss_actor" in m and not torch.equal(actor_before, algo.actor.mu.weight)


def test_logged_metrics_average_over_the_steps_that_report_them(tmp_path):
    """The delayed actor reports every second step: its metrics are averaged over those steps, not halved
    by the critic-only steps between them (a multiplier held at 1 logs 1)."""
    pid = PIDConfig(ki=0.0, init=1.0)
    algo = TD3BC(3, 1, TD3BCConfig(**SMALL, cost_q_limit=0.1, pid=pid))  # policy_freq 2
    buf = make_buffer()
    fit(algo, lambda: buf.sample(32), 8, tmp_path, {}, log_every=8, progress=False)
    logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert logged["train/lagrange_multiplier"] == 1.0


@pytest.mark.parametrize(
    "cls,cfg",
    [
        (TD3BC, TD3BCConfig(**SMALL, policy_freq=1, actor_warmup=3)),
        (IQL, IQLConfig(**SMALL, actor_warmup=3)),
        (ReBRAC, ReBRACConfig(**SMALL, policy_freq=1, actor_warmup=3)),
    ],
    ids=["td3bc", "iql", "rebrac"],
)
def test_actor_holds_its_warm_start_while_the_critics_warm_up(cls, cfg):
    algo = cls(3, 1, cfg)
    buf = make_buffer()
    actor = {k: v.clone() for k, v in algo.actor.state_dict().items()}
    critic = {k: v.clone() for k, v in algo.critic.state_dict().items()}
    for _ in range(3):
        m = algo.update(buf.sample(32))
        assert "loss_actor" not in m
    assert all(torch.equal(v, algo.actor.state_dict()[k]) for k, v in actor.items())
    assert not all(torch.equal(v, algo.critic.state_dict()[k]) for k, v in critic.items())
    assert "loss_actor" in algo.update(buf.sample(32))
    assert not all(torch.equal(v, algo.actor.state_dict()[k]) for k, v in actor.items())


def test_iql_value_losses_are_expectiles():
    diff = torch.tensor([-1.0, 1.0])
    assert expectile_loss(diff, 0.5).item() == pytest.approx(0.5)
    assert expectile_loss(diff, 0.9).item() == pytest.approx((0.1 + 0.9) / 2)
    # the expectile of {0, 1} at tau is tau: the loss is smallest there
    xs = torch.linspace(0, 1, 101)
    losses = torch.stack([expectile_loss(torch.tensor([0.0, 1.0]) - x, 0.7) for x in xs])
    assert xs[losses.argmin()].item() == pytest.approx(0.7, abs=0.011)


@pytest.mark.parametrize(
    "cls,cfg",
    [(TD3BC, TD3BCConfig(**SMALL)), (IQL, IQLConfig(**SMALL)), (ReBRAC, ReBRACConfig(**SMALL))],
    ids=["td3bc", "iql", "rebrac"],
)
def test_same_seed_same_parameters(cls, cfg):
    def run():
        torch.manual_seed(0)
        algo, buf = cls(3, 1, cfg), make_buffer()
        for _ in range(4):
            algo.update(buf.sample(32))
        return {k: v.clone() for k, v in algo.actor.state_dict().items()}

    a, b = run(), run()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("algo", ["td3bc", "iql", "rebrac"])
def test_bc_warm_start_then_checkpoint_acts_like_the_live_policy_and_resumes(tiny_dataset, tmp_path, algo):
    train_bc(tiny_dataset, tmp_path / "bc", steps=3, **TINY)
    bc_actor = load_policy(tmp_path / "bc").actor.state_dict()
    out = tmp_path / algo
    train_offline_algo(algo, tiny_dataset, out, steps=4, init_actor=tmp_path / "bc", **TINY)
    rec = read_config(out)
    assert rec["algo"] == algo and rec["init_actor"]["keys"] >= 4
    assert rec["config"]["cost_q_limit"] is not None  # constrained by default
    obs = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    policy = load_policy(out)
    assert policy.act(obs).shape == (8, 1)
    assert any(not torch.equal(v, policy.actor.state_dict()[k]) for k, v in bc_actor.items())
    again = train_offline_algo(algo, tiny_dataset, out, steps=4, **TINY)  # finished: returned, not retrained
    assert again["steps"] == 4


def test_offline_stages_standardise_every_input_on_the_data_and_checkpoints_carry_it(tiny_dataset, tmp_path):
    data, _ = read_dataset(tiny_dataset)
    mean, std = data.obs.mean(0), data.obs.std(0)
    train_bc(tiny_dataset, tmp_path / "bc", steps=3, **TINY)
    train_offline_algo("td3bc", tiny_dataset, tmp_path / "td3bc", steps=2, init_actor=tmp_path / "bc", **TINY)
    bc, td3bc = load_policy(tmp_path / "bc"), load_policy(tmp_path / "td3bc")
    for actor in (bc.actor, td3bc.actor):
        np.testing.assert_allclose(actor.obs_norm.mean.numpy(), mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(actor.obs_norm.std.numpy(), np.maximum(std, OBS_STD_FLOOR), rtol=1e-5)
    raw = TanhGaussianActor(3, 1, (64, 64))  # the same weights, without the statistics
    weights = td3bc.actor.state_dict()
    raw.load_state_dict({k: v for k, v in weights.items() if not k.startswith("obs_norm.")}, strict=False)
    obs = torch.as_tensor(data.obs[:8].copy())
    standardized = (obs - torch.as_tensor(mean)) / torch.as_tensor(std)
    torch.testing.assert_close(td3bc.actor.act(obs), raw.act(standardized))
    state = load_file(str(tmp_path / "td3bc" / "train_state" / "state.safetensors"))
    for net in ("critic", "critic_target", "cost_critic"):
        np.testing.assert_allclose(state[f"{net}.obs_norm.mean"].numpy(), mean, rtol=1e-5, atol=1e-6)


def test_obs_standardization_floors_the_spread_and_leaves_the_context_alone():
    obs = np.array([[0.0, 5.0, 2.0], [2.0, 5.0, 4.0]])
    mean, std = obs_standardization(obs, context_dim=1)
    np.testing.assert_allclose(mean, [1.0, 5.0, 0.0])
    np.testing.assert_allclose(std, [1.0, OBS_STD_FLOOR, 1.0])
    off = TD3BC(3, 1, TD3BCConfig(**SMALL))  # nothing standardises a learner built outside an offline stage
    assert torch.equal(off.actor.obs_norm.std, torch.ones(3)) and torch.equal(
        off.critic.obs_norm.mean, torch.zeros(3)
    )


def test_unknown_offline_algorithm_is_named(tiny_dataset, tmp_path):
    with pytest.raises(ValueError, match="unknown offline algorithm 'awac'.*cql, td3bc, iql, rebrac"):
        train_offline_algo("awac", tiny_dataset, tmp_path / "x", steps=1, **TINY)


def _saturated_data(n=4096, seed=0):
    """A behaviour ``clip(tanh(w s) + 0.3 eps)`` whose mean sits near the bound: a third of the entries
    are logged at exactly 1 (as after clipping), the rest inside."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.rand(n, 2, generator=g) * 2 - 1
    mean = torch.tanh(1.5 + 0.5 * obs[:, :1])  # 0.76 .. 0.96
    act = (mean + 0.3 * torch.randn(n, 1, generator=g)).clamp(-1, 1)
    return obs, act, mean


def test_clipped_gaussian_bc_recovers_the_mean_of_saturated_actions():
    obs, act, mean = _saturated_data()
    assert (act == 1.0).float().mean() > 0.25
    fits = {}
    for name, loss_fn in {
        "clipped": lambda a: compute_bc_loss(a, obs, act).actor,
        "tanh_density": lambda a: -a.log_prob(obs, act).mean(),  # the density at atanh(1 - 1e-6)
    }.items():
        torch.manual_seed(0)
        actor = TanhGaussianActor(2, 1, (32, 32))
        opt = torch.optim.Adam(actor.parameters(), lr=3e-3)
        for _ in range(600):
            loss = loss_fn(actor)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            fits[name] = (actor.act(obs, True) - mean).abs().mean().item()
    assert fits["clipped"] < 0.05, fits  # the behaviour's own mean, to within 0.05
    assert fits["clipped"] < fits["tanh_density"] / 2, fits


def test_clipped_gaussian_log_prob_is_finite_at_the_bounds_and_censors_them():
    actor = TanhGaussianActor(2, 2, (8,))
    obs = torch.zeros(3, 2)
    act = torch.tensor([[1.0, -1.0], [0.0, 0.5], [0.9999999, -0.9999999]])
    lp = clipped_gaussian_log_prob(actor, obs, act)
    assert torch.isfinite(lp).all()
    assert lp[0].item() == pytest.approx(lp[2].item())  # both rows at the bounds: the same censored mass
    assert lp[0].item() < 0  # a probability, not a density


def test_gaussian_bc_trains_on_saturated_rows():
    obs, act, _ = _saturated_data(512)
    bc = BC(2, 1, BCConfig(hidden=(16, 16), batch_size=64))
    from arl_models.replay import Batch

    batch = Batch(
        obs=obs[:64],
        act=act[:64],
        rew=torch.zeros(64),
        cost=torch.zeros(64),
        next_obs=obs[:64],
        done=torch.zeros(64),
    )
    m = [bc.update(batch)["loss_actor"] for _ in range(50)]
    assert np.isfinite(m).all() and m[-1] < m[0]
