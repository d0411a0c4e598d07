"""Unit tests of the algorithms, in the spirit of STYLE.md: finite losses, what moves, what each loss
touches, determinism, and save/load."""

import copy
import dataclasses

import numpy as np
import pytest
import torch

from arl_models.algos.bc import BC, BCConfig, compute_bc_loss
from arl_models.algos.cql import CQL, CQLConfig, conservative_gap
from arl_models.algos.sac import SAC, SACConfig
from arl_models.nets import EnsembleCritic, TanhGaussianActor
from tests.conftest import make_buffer

SMALL = dict(hidden=(16, 16), batch_size=32)


def _algos():
    return [
        BC(3, 1, BCConfig(**SMALL, policy="gaussian")),
        BC(3, 1, BCConfig(**SMALL, policy="deterministic")),
        SAC(3, 1, SACConfig(**SMALL)),
        CQL(3, 1, CQLConfig(**SMALL, n_action_samples=4)),
        CQL(3, 1, CQLConfig(**SMALL, n_action_samples=4, lagrangian_threshold=1.0, cost_q_limit=0.1)),
        CQL(3, 1, CQLConfig(**SMALL, n_action_samples=4, context_dim=1)),
    ]


@pytest.mark.parametrize(
    "algo", _algos(), ids=lambda a: f"{a.name}{'-film' if getattr(a.cfg, 'context_dim', 0) else ''}"
)
def test_update_is_finite_and_moves_every_trained_parameter(algo):
    buf = make_buffer()
    before = {
        f"{n}.{k}": v.clone() for n, net in algo.networks().items() for k, v in net.state_dict().items()
    }
    for _ in range(3):
        metrics = algo.update(buf.sample(32))
    assert metrics and all(np.isfinite(v) for v in metrics.values()), metrics
    after = {f"{n}.{k}": v for n, net in algo.networks().items() for k, v in net.state_dict().items()}
    for k, v in before.items():
        if k.startswith("actor.log_std") and getattr(algo.cfg, "policy", "") == "deterministic":
            continue
        if ".obs_norm." in k:  # fixed statistics, set from a dataset
            continue
        assert not torch.equal(v, after[k]), f"{k} did not move"


def test_actor_loss_leaves_critic_gradients_at_zero():
    algo = SAC(3, 1, SACConfig(**SMALL))
    batch = make_buffer().sample(32)
    for p in algo.critic.parameters():
        p.grad = None
    loss, _, _ = algo.actor_loss(batch.obs)
    loss.backward()
    assert all(p.grad is None for p in algo.critic.parameters())
    assert all(p.grad is not None for p in algo.actor.parameters())


def test_critic_loss_leaves_actor_gradients_at_zero():
    algo = CQL(3, 1, CQLConfig(**SMALL, n_action_samples=4))
    batch = make_buffer().sample(32)
    with torch.no_grad():
        na, nl = algo.actor.sample(batch.next_obs)
    loss, _ = algo.critic_loss(batch, na, nl)
    loss.backward()
    assert all(p.grad is None for p in algo.actor.parameters())
    assert all(p.grad is not None for p in algo.critic.parameters())


def test_update_does_not_mutate_the_batch():
    algo = CQL(3, 1, CQLConfig(**SMALL, n_action_samples=4))
    batch = make_buffer().sample(32)
    snapshot = copy.deepcopy(batch)
    algo.update(batch)
    for k, v in snapshot.__dict__.items():  # next_act is None: make_buffer's rows have no next actions
        assert v is None if getattr(batch, k) is None else torch.equal(getattr(batch, k), v), k


def test_same_seed_same_parameters():
    def run():
        algo = CQL(3, 1, CQLConfig(**SMALL, n_action_samples=4, seed=3))
        buf = make_buffer()
        for _ in range(5):
            algo.update(buf.sample(32))
        return algo.actor.state_dict()

    a, b = run(), run()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_fused_ensemble_equals_separate_critics():
    critic = EnsembleCritic(3, 1, (8, 8), ensemble=3)
    obs, act = torch.randn(5, 3), torch.rand(5, 1)
    fused = critic(obs, act)
    for e in range(3):
        x = torch.cat([obs, act], -1)
        for layer in critic.hidden:
            x = torch.relu(x @ layer.weight[e] + layer.bias[e])
        q = (x @ critic.out.weight[e] + critic.out.bias[e]).squeeze(-1)
        torch.testing.assert_close(fused[e], q)


def _nominal(obs: torch.Tensor, k: int) -> torch.Tensor:
    obs = obs.clone()
    obs[:, -k:] = 0.0
    return obs


def test_conditioned_networks_compute_the_plain_ones_at_the_nominal_context():
    obs, act = _nominal(torch.randn(6, 5), 2), torch.rand(6, 1) * 2 - 1
    torch.manual_seed(0)
    plain = (TanhGaussianActor(5, 1, (8, 8)), EnsembleCritic(5, 1, (8, 8), ensemble=2))
    torch.manual_seed(0)
    film = (
        TanhGaussianActor(5, 1, (8, 8), context_dim=2),
        EnsembleCritic(5, 1, (8, 8), ensemble=2, context_dim=2),
    )
    assert torch.equal(plain[0].act(obs), film[0].act(obs)) and torch.equal(
        plain[1](obs, act), film[1](obs, act)
    )
    with (
        torch.no_grad()
    ):  # modulation weights that are not zero change nothing at context 0, everything off it
        for p in [*film[0].trunk.film, film[0].film, *film[1].film]:
            p.uniform_(-1.0, 1.0)
    assert torch.equal(plain[0].act(obs), film[0].act(obs)) and torch.equal(
        plain[1](obs, act), film[1](obs, act)
    )
    off = obs.clone()
    off[:, -1] = -2.0
    assert not torch.allclose(plain[1](off, act), film[1](off, act))
    assert not torch.allclose(plain[0].act(off), film[0].act(off))


def test_a_conditioned_actor_reverses_its_action_and_keeps_its_spread():
    """The reversed plant (2.1.0: actuator offset -2) needs ``-mu`` at the same ``log_std``: one row of the
    actor's output FiLM gives exactly that, which a gain on the features under both heads cannot."""
    actor = TanhGaussianActor(5, 1, (8, 8), context_dim=2)
    reversed_plant = _nominal(torch.randn(6, 5), 2)
    reversed_plant[:, -1] = -2.0
    with torch.no_grad():
        h = actor.trunk(reversed_plant)
        unmodulated = actor.mu(h), actor.log_std(h)
        actor.film[1, 0] = 1.0  # the actuator entry's gain row: 1 + 1 * (-2) = -1 on the mean, no shift
        mu, log_std = actor.dist_params(reversed_plant)
    assert torch.equal(mu, -unmodulated[0]) and torch.equal(log_std, unmodulated[1])


def test_nominal_data_leave_the_modulation_weights_untouched():
    """The gradient of ``W`` is proportional to the context: the nominal plant's data cannot move it, so
    what a later plant teaches there leaves the nominal policy as it was."""
    algo = CQL(3, 1, CQLConfig(**SMALL, n_action_samples=4, context_dim=1))
    batch = make_buffer().sample(32)
    batch = dataclasses.replace(batch, obs=_nominal(batch.obs, 1), next_obs=_nominal(batch.next_obs, 1))
    film = [*algo.actor.trunk.film, algo.actor.film, *algo.critic.film]
    algo.update(batch)
    assert all(torch.count_nonzero(p) == 0 for p in film)


def test_modulation_weights_learn_at_their_own_rate(tmp_path):
    """Adam's first step moves every weight with a gradient by its learning rate: the FiLM weights by
    ``context_lr_scale`` times the network's, the others by the network's; a checkpoint keeps both."""
    from arl_models.checkpoint import load_train_state, save_checkpoint

    cfg = CQLConfig(**SMALL, n_action_samples=4, context_dim=1, context_lr_scale=10.0)
    algo = CQL(3, 1, cfg)
    before = {n: p.detach().clone() for n, p in algo.critic.named_parameters()}
    algo.update(make_buffer().sample(32))
    for name, p in algo.critic.named_parameters():
        lr = cfg.critic_lr * (10.0 if name.startswith("film.") else 1.0)
        assert (p - before[name]).abs().max().item() == pytest.approx(lr, rel=1e-3), name
    save_checkpoint(tmp_path, algo, {"config": dataclasses.asdict(cfg)})
    again = CQL(3, 1, cfg)
    load_train_state(tmp_path, again)
    assert [g["lr"] for g in again.critic_opt.param_groups] == [cfg.critic_lr, 10.0 * cfg.critic_lr]
    for one_group in (
        dataclasses.replace(cfg, context_lr_scale=1.0),
        dataclasses.replace(cfg, context_dim=0),
    ):
        assert len(CQL(3, 1, one_group).critic_opt.param_groups) == 1
    with pytest.raises(
        ValueError, match=r"optimizer was saved with 2 parameter group\(s\), this configuration builds 1"
    ):
        load_train_state(tmp_path, CQL(3, 1, dataclasses.replace(cfg, context_lr_scale=1.0)))
    bc = BC(3, 1, BCConfig(**SMALL, context_dim=1, context_lr_scale=10.0))
    assert [g["lr"] for g in bc.actor_opt.param_groups] == [bc.cfg.lr, 10.0 * bc.cfg.lr]


def test_context_dim_must_leave_a_state():
    with pytest.raises(
        ValueError, match="context_dim must lie in \\[0, 3\\) for observations of 3 entries, got 3"
    ):
        EnsembleCritic(3, 1, (8,), context_dim=3)
    with pytest.raises(ValueError, match="context_dim"):
        TanhGaussianActor(3, 1, (8,), context_dim=-1)


def test_conservative_gap_is_logsumexp_minus_data():
    q_data = torch.tensor([[1.0, 2.0]])  # (E=1, B=2)
    q_s = torch.tensor([[[0.0, 1.0], [2.0, 2.0]]])  # (1, 2, K=2)
    logd = torch.zeros(2, 2)
    gap = conservative_gap(q_data, q_s, logd)
    expected = ((torch.logsumexp(q_s[0], -1) - np.log(2)) - q_data[0]).mean()
    torch.testing.assert_close(gap, expected.reshape(1))


def test_tanh_gaussian_log_prob_matches_sample():
    torch.manual_seed(0)
    actor = TanhGaussianActor(3, 2, (16,))
    obs = torch.randn(64, 3)
    a, logp = actor.sample(obs)
    torch.testing.assert_close(actor.log_prob(obs, a), logp, atol=2e-3, rtol=1e-3)


def test_bc_losses():
    actor = TanhGaussianActor(3, 1, (16,))
    obs, act = torch.randn(8, 3), torch.rand(8, 1) * 1.8 - 0.9  # inside the bounds: a Gaussian density
    mu, log_std = actor.dist_params(obs)
    density = torch.distributions.Normal(torch.tanh(mu), log_std.exp()).log_prob(act).sum(-1)
    assert compute_bc_loss(actor, obs, act).actor.item() == pytest.approx(-density.mean().item(), rel=1e-5)


def test_cql_warm_start_copies_bc_actor():
    bc = BC(3, 1, BCConfig(**SMALL, policy="deterministic"))
    cql = CQL(3, 1, CQLConfig(**SMALL))
    keys = cql.warm_start_actor(bc.actor.state_dict())
    assert keys and all(k.startswith(("trunk", "mu", "obs_norm")) for k in keys)
    obs = torch.randn(4, 3)
    torch.testing.assert_close(cql.actor.act(obs, deterministic=True), bc.actor(obs))


def test_lagrangian_conservative_weight_rises_when_gap_exceeds_threshold():
    algo = CQL(3, 1, CQLConfig(**SMALL, n_action_samples=4, lagrangian_threshold=-100.0, alpha_lr=0.1))
    buf = make_buffer()
    w0 = algo.conservative_weight()
    for _ in range(5):
        algo.update(buf.sample(32))
    assert algo.conservative_weight() > w0


def test_bf16_critic_pass_tracks_float32():
    """The opt-in bf16 critic pass gives finite losses and Q values close to the float32 ones."""
    cfgs = [
        CQLConfig(**SMALL, n_action_samples=4, seed=1, critic_precision=p) for p in ("float32", "bfloat16")
    ]
    buf = make_buffer()
    torch.manual_seed(0)
    batch = buf.sample(32)
    outs = []
    for cfg in cfgs:
        algo = CQL(3, 1, cfg)
        torch.manual_seed(1)
        na, nl = algo.actor.sample(batch.next_obs)
        losses, q_data = algo.compute_losses(batch, na, nl)
        assert q_data.dtype == torch.float32 and torch.isfinite(losses.td + losses.conservative)
        outs.append(q_data)
    torch.testing.assert_close(outs[0], outs[1], atol=0.05, rtol=0.02)


def test_cql_actor_warmup_imitates_the_data_then_follows_the_critic():
    algo = CQL(3, 1, CQLConfig(**SMALL, n_action_samples=4, actor_warmup_steps=2))
    batch = make_buffer().sample(32)

    def loss_at(step, critic_scale):
        algo.step = step
        with torch.no_grad():
            for p in algo.critic.parameters():
                p.mul_(critic_scale)
        torch.manual_seed(0)
        return algo.actor_loss(batch.obs, batch.act)[0].item()

    # in the warm-up the loss is the data's log-likelihood, whatever the critic says
    torch.manual_seed(0)
    _, logp = algo.actor.sample(batch.obs)
    expected = (
        algo.temperature * logp.mean() + compute_bc_loss(algo.actor, batch.obs, batch.act).actor
    ).item()
    assert loss_at(1, 1.0) == pytest.approx(expected)
    assert loss_at(1, 3.0) == pytest.approx(expected)
    # afterwards the critic drives it
    assert loss_at(2, 1.0) != pytest.approx(loss_at(2, 3.0))
