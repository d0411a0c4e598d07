"""ReBRAC: the data's next action in the replay, the penalised critic target, what each loss touches, the
LayerNorm critics, save and load, the BC warm start and the cost constraint."""

import numpy as np
import pytest
import torch

from arl_models.algos.bc import BC, BCConfig
from arl_models.algos.rebrac import (
    ReBRAC,
    ReBRACConfig,
    compute_actor_loss,
    compute_critic_loss,
    penalised_target,
)
from arl_models.checkpoint import config_record, load_policy, load_train_state, save_checkpoint
from arl_models.data.dataset import Transitions, with_metadata
from arl_models.lagrange import PIDConfig
from arl_models.nets import EnsembleCritic
from arl_models.replay import FIELDS, ActionScaler, Batch, ReplayBuffer, next_actions_of, row_layout
from tests.conftest import make_transitions

SMALL = dict(hidden=(16, 16), batch_size=32)
SCALER = ActionScaler(np.array([-2.0], np.float32), np.array([2.0], np.float32))


def _buffer(next_actions: bool = True) -> ReplayBuffer:
    return ReplayBuffer.from_transitions(make_transitions(), SCALER, next_actions=next_actions)


def _episodes() -> Transitions:
    """Three episodes stored out of order: 0 ends by termination at step 2, 1 by truncation at step 1,
    2 is cut after step 1 of a longer run (its step 2 was not logged); action = 10 * episode + step."""
    ep = np.array([1, 0, 2, 0, 1, 0, 2], np.int64)
    st = np.array([1, 2, 0, 0, 0, 1, 1], np.int32)
    n = len(ep)
    return Transitions(
        obs=np.zeros((n, 2), np.float32),
        action=(10.0 * ep + st).astype(np.float32)[:, None],
        reward=np.zeros(n, np.float32),
        cost=np.zeros(n, np.float32),
        next_obs=np.zeros((n, 2), np.float32),
        terminated=(ep == 0) & (st == 2),
        truncated=(ep == 1) & (st == 1),
        episode_id=ep,
        step=st,
        **with_metadata(n, env_version="1.0.0", policy_hash="ab" * 32, random_seed=7),
    )


def test_next_action_is_the_next_row_of_the_same_episode_else_the_rows_own():
    t = _episodes()
    got = next_actions_of(t)[:, 0]
    # rows: (1,1) truncated, (0,2) terminated, (2,0), (0,0), (1,0), (0,1), (2,1) cut
    assert got.tolist() == [11.0, 2.0, 21.0, 1.0, 11.0, 2.0, 21.0]


def test_the_replay_carries_next_actions_only_when_asked():
    t = _episodes()
    scaler = ActionScaler.of([-30.0], [30.0])
    with_next = ReplayBuffer.from_transitions(t, scaler, next_actions=True)
    batch = with_next.gather(torch.arange(len(t)))
    assert batch.next_act is not None
    assert torch.allclose(batch.next_act, torch.as_tensor(scaler.normalize(next_actions_of(t))))
    assert torch.allclose(batch.act, torch.as_tensor(scaler.normalize(t.action)))
    plain = ReplayBuffer.from_transitions(t, scaler)
    assert plain.gather(torch.arange(len(t))).next_act is None
    assert plain.fields == FIELDS and plain.rows.shape[1] == 2 * 2 + 1 + 3  # the layout other algos had
    assert with_next.rows.shape[1] == plain.rows.shape[1] + 1
    assert row_layout(2, 1) == {k: v for k, v in row_layout(2, 1, True).items() if k != "next_act"}
    restored = ReplayBuffer(len(t), 2, 1, next_actions=True)
    restored.load_state_dict(with_next.state_dict())
    assert torch.equal(restored.rows, with_next.rows)


def test_the_critic_target_penalises_the_distance_to_the_datas_next_action():
    batch = Batch(
        obs=torch.zeros(2, 1),
        act=torch.zeros(2, 2),
        rew=torch.tensor([1.0, 1.0]),
        cost=torch.zeros(2),
        next_obs=torch.zeros(2, 1),
        done=torch.tensor([0.0, 1.0]),
        next_act=torch.tensor([[0.0, 0.0], [0.0, 0.0]]),
    )
    next_act = torch.tensor([[0.5, -0.5], [1.0, 1.0]])
    target = penalised_target(batch, torch.tensor([5.0, 5.0]), next_act, gamma=0.9, critic_bc_coef=2.0)
    # sum (a~' - a')^2 = 0.5: 1 + 0.9 (5 - 2 * 0.5); the terminal row is its reward alone
    assert target.tolist() == pytest.approx([1.0 + 0.9 * 4.0, 1.0])


def test_the_critic_loss_uses_the_batchs_next_action():
    torch.manual_seed(0)
    critic = EnsembleCritic(3, 1, (8,), layer_norm=True)
    batch = _buffer().sample(32)
    assert batch.next_act is not None
    smoothed = torch.rand(32, 1) * 2 - 1
    free, _ = compute_critic_loss(critic, critic, batch, smoothed, 0.99, 0.0)
    penalised, _ = compute_critic_loss(critic, critic, batch, smoothed, 0.99, 1.0)
    assert not torch.isclose(free, penalised)
    on_data = Batch(**{**batch.__dict__, "next_act": smoothed})  # the data's next action is the target's
    same, _ = compute_critic_loss(critic, critic, on_data, smoothed, 0.99, 1.0)
    assert torch.isclose(same, free)


@pytest.mark.parametrize("constrained", [False, True], ids=["free", "constrained"])
def test_update_is_finite_and_moves_every_trained_network(constrained):
    cfg = ReBRACConfig(**SMALL, policy_freq=1, cost_q_limit=0.1 if constrained else None)
    algo, buf = ReBRAC(3, 1, cfg), _buffer()
    nets = algo.networks().items()
    before = {f"{n}.{k}": p.detach().clone() for n, net in nets for k, p in net.named_parameters()}
    assert any(".norms." in k for k in before if k.startswith("critic."))
    assert not any(".norms." in k for k in before if k.startswith("cost_critic"))
    for _ in range(3):
        metrics = algo.update(buf.sample(32))
    assert metrics and all(np.isfinite(v) for v in metrics.values()), metrics
    assert ("lagrange_multiplier" in metrics) == constrained
    after = {f"{n}.{k}": v for n, net in algo.networks().items() for k, v in net.named_parameters()}
    assert [k for k, v in before.items() if torch.equal(v, after[k])] == []


def test_update_does_not_mutate_the_batch():
    algo, batch = ReBRAC(3, 1, ReBRACConfig(**SMALL, policy_freq=1)), _buffer().sample(32)
    snapshot = {k: v.clone() for k, v in batch.__dict__.items()}
    algo.update(batch)
    assert all(torch.equal(getattr(batch, k), v) for k, v in snapshot.items())


def test_a_batch_without_next_actions_is_refused():
    algo = ReBRAC(3, 1, ReBRACConfig(**SMALL))
    with pytest.raises(ValueError, match="next_actions=True"):
        algo.update(_buffer(next_actions=False).sample(32))


def test_each_loss_touches_only_its_own_networks():
    algo, batch = ReBRAC(3, 1, ReBRACConfig(**SMALL)), _buffer().sample(32)
    assert algo.cost is not None
    losses = compute_actor_loss(algo.actor, algo.critic, batch, algo.cfg, algo.cost.critic, 1.0)
    losses.actor.backward()
    assert all(p.grad is None for p in algo.critic.parameters())
    assert all(p.grad is None for p in algo.cost.critic.parameters())
    assert all(p.grad is not None for p in algo.actor.parameters())
    algo.actor.zero_grad(set_to_none=True)
    next_act = algo.actor_target.act(batch.next_obs)
    loss, _ = compute_critic_loss(algo.critic, algo.critic_target, batch, next_act, 0.99, 0.01)
    loss.backward()
    assert all(p.grad is None for p in algo.actor.parameters())
    assert all(p.grad is None for p in algo.actor_target.parameters())
    assert all(p.grad is not None for p in algo.critic.parameters())


def test_the_actor_is_delayed_and_the_bc_penalty_is_summed_over_action_entries():
    algo = ReBRAC(3, 2, ReBRACConfig(**SMALL))  # policy_freq 2
    t = make_transitions(act_dim=2)
    buf = ReplayBuffer.from_transitions(t, ActionScaler.of([-2.0, -2.0], [2.0, 2.0]), next_actions=True)
    batch = buf.sample(32)
    losses = compute_actor_loss(algo.actor, algo.critic, batch, algo.cfg)
    with torch.no_grad():
        expected = (algo.actor.act_mean(batch.obs) - batch.act).pow(2).sum(-1).mean()
    assert torch.isclose(losses.bc, expected)
    actor_before = algo.actor.mu.weight.detach().clone()
    assert "loss_actor" not in algo.update(batch) and torch.equal(actor_before, algo.actor.mu.weight)
    assert "loss_actor" in algo.update(batch) and not torch.equal(actor_before, algo.actor.mu.weight)


def test_same_seed_same_parameters():
    def run():
        torch.manual_seed(0)
        algo, buf = ReBRAC(3, 1, ReBRACConfig(**SMALL)), _buffer()
        for _ in range(4):
            algo.update(buf.sample(32))
        return {
            f"{n}.{k}": v.clone() for n, net in algo.networks().items() for k, v in net.state_dict().items()
        }

    a, b = run(), run()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_save_and_load_give_the_same_actions_and_state(tmp_path):
    algo, buf = ReBRAC(3, 1, ReBRACConfig(**SMALL, cost_q_limit=0.1)), _buffer()
    for _ in range(4):
        algo.update(buf.sample(32))
    env = {"task": "safe-pendulum", "env_version": "1.0.0", "obs_dim": 3, "action_dim": 1}
    env |= {"action_low": [-2.0], "action_high": [2.0]}
    save_checkpoint(tmp_path, algo, config_record(algo, env))
    obs = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    assert np.allclose(load_policy(tmp_path).act(obs), SCALER.unnormalize(algo.act(obs)))
    fresh = ReBRAC(3, 1, ReBRACConfig(**SMALL, cost_q_limit=0.1, seed=1))
    load_train_state(tmp_path, fresh)
    assert fresh.step == algo.step and fresh.extra_state() == algo.extra_state()
    for name, net in algo.networks().items():
        theirs = fresh.networks()[name].state_dict()
        assert all(torch.equal(v, theirs[k]) for k, v in net.state_dict().items()), name


def test_warm_start_from_bc_copies_the_actor_and_its_target():
    bc = BC(3, 1, BCConfig(**SMALL, policy="deterministic"))
    algo = ReBRAC(3, 1, ReBRACConfig(**SMALL))
    copied = algo.warm_start_actor(bc.actor.state_dict())
    assert set(copied) == set(bc.actor.state_dict())
    for net in (algo.actor, algo.actor_target):
        assert all(torch.equal(v, net.state_dict()[k]) for k, v in bc.actor.state_dict().items())
    obs = torch.randn(5, 3)
    assert torch.allclose(algo.actor.act(obs), bc.actor.act(obs))


@pytest.mark.parametrize(("limit", "rises"), [(-1.0, True), (1e6, False)])
def test_the_multiplier_rises_only_while_the_cost_critic_exceeds_the_limit(limit, rises):
    pid = PIDConfig(kp=0.0, ki=0.1)
    algo, buf = ReBRAC(3, 1, ReBRACConfig(**SMALL, policy_freq=1, cost_q_limit=limit, pid=pid)), _buffer()
    for _ in range(5):
        m = algo.update(buf.sample(32))
    assert (m["lagrange_multiplier"] > 0.0) == rises, m


def test_the_multiplier_prices_the_cost_in_the_actors_loss_scaled_with_the_objective():
    algo, batch = ReBRAC(3, 1, ReBRACConfig(**SMALL)), _buffer().sample(32)
    assert algo.cost is not None
    free = compute_actor_loss(algo.actor, algo.critic, batch, algo.cfg, algo.cost.critic, None)
    priced = compute_actor_loss(algo.actor, algo.critic, batch, algo.cfg, algo.cost.critic, 2.0)
    with torch.no_grad():
        q = algo.critic(batch.obs, algo.actor.act_mean(batch.obs)).min(0).values
    scale = 1.0 / (q.abs().mean() + 2.0 * free.qc.abs().mean())
    assert torch.isclose(priced.q_scale, scale)
    expected = free.actor + free.q_scale * q.mean() - scale * (q - 2.0 * free.qc).mean()
    assert torch.isclose(priced.actor, expected, atol=1e-5)
