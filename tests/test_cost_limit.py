"""The offline constraint: the undiscounted episode budget as a limit on the discounted ``Q_c``, the
multiplier that holds it, the cost critic's floor and its start at the data's cost-to-go."""

import numpy as np
import pytest
import torch

from arl_models.algos.calql import mc_returns
from arl_models.algos.sac import SAC, SACConfig, td_loss
from arl_models.checkpoint import read_config
from arl_models.data import read_dataset, read_info, write_dataset
from arl_models.lagrange import PIDConfig
from arl_models.offline import (
    OFFLINE_CLASSES,
    InfeasibleBudgetWarning,
    cql_cost_limit,
    held_to_budget,
    train_cql,
)
from tests.conftest import make_buffer, make_transitions, pendulum_info


@pytest.mark.parametrize("horizon", [1, 200, 1000])
def test_limit_is_the_discounted_value_of_the_budget_spread_over_the_episode(horizon):
    info = pendulum_info()
    per_step = info.cost_budget / horizon
    discounted = sum(per_step * 0.99**t for t in range(horizon))
    assert cql_cost_limit(info, 0.99, horizon) == pytest.approx(discounted)


def test_the_budget_is_not_the_limit_of_a_discounted_value():
    info = pendulum_info()  # budget 12, 200-step episodes
    assert cql_cost_limit(info, 0.99) == pytest.approx(12.0 / 200 * (1 - 0.99**200) / 0.01)
    assert cql_cost_limit(info, 0.99) < 0.5 * info.cost_budget
    # hopper's horizon
    assert cql_cost_limit(info, 0.99, 1000) == pytest.approx(0.1 * info.cost_budget, rel=1e-3)
    # undiscounted: one step's share
    assert cql_cost_limit(info, 0.0) == pytest.approx(info.cost_budget / 200)


def _paying(costs_per_episode: list[list[int]], length: int = 200):
    """Transitions whose episode ``i`` pays 1 on each step listed in ``costs_per_episode[i]``."""
    t = make_transitions(n_episodes=len(costs_per_episode), length=length)
    t.cost[:] = 0.0
    for i, steps in enumerate(costs_per_episode):
        t.cost[i * length + np.asarray(steps, dtype=int)] = 1.0
    return t


def test_episode_start_costs_are_discounted_from_each_episodes_first_step():
    t = _paying([[0], [10, 20], []])
    assert np.allclose(t.episode_costs(0.9), [1.0, 0.9**10 + 0.9**20, 0.0])


def test_data_within_budget_that_pay_early_raise_the_limit_to_what_they_pay():
    info = pendulum_info()  # budget 12 over 200 steps: an even spread is 4.33 discounted
    uniform = cql_cost_limit(info, 0.99)
    early = _paying([list(range(12)), list(range(10)), list(range(40))])  # the third is over budget
    paid = early.episode_costs(0.99)[:2]
    assert paid.mean() > uniform
    assert cql_cost_limit(info, 0.99, data=early) == pytest.approx(paid.mean())
    late = _paying([list(range(188, 200))] * 2)  # within budget, paid late: the even spread stays the limit
    assert cql_cost_limit(info, 0.99, data=late) == pytest.approx(uniform)
    # no episode meets the budget: what the episodes pay, and a warning
    over = _paying([list(range(40))] * 2)
    with pytest.warns(InfeasibleBudgetWarning, match="no episode of the dataset meets the cost budget 12"):
        assert cql_cost_limit(info, 0.99, data=over) == pytest.approx(over.episode_costs(0.99)[0])


def test_when_no_episode_meets_the_budget_the_limit_is_what_the_data_pays_on_average():
    info = pendulum_info()
    # twenty episodes over budget (12): two pay 13 early, the rest 40
    t = _paying([list(range(13))] * 2 + [list(range(40))] * 18)
    with pytest.warns(InfeasibleBudgetWarning, match="on average"):
        limit = cql_cost_limit(info, 0.99, data=t)
    assert limit == pytest.approx(t.episode_costs(0.99).mean())
    assert limit > cql_cost_limit(info, 0.99)


def test_constrained_cql_is_held_to_that_limit(tmp_path):
    """``train_cql`` calibrates the limit on its own data: here episodes that pay early, within budget."""
    data = tmp_path / "early"
    write_dataset(data, _paying([list(range(10))] * 4, length=50), pendulum_info())
    train_cql(data, tmp_path / "cql", steps=2, progress=False, eval_episodes=0)
    cfg = read_config(tmp_path / "cql")["config"]
    expected = cql_cost_limit(read_info(data), cfg["gamma"], data=read_dataset(data)[0])
    assert expected > cql_cost_limit(read_info(data), cfg["gamma"])
    assert np.isclose(cfg["cost_q_limit"], expected)
    train_cql(data, tmp_path / "free", steps=2, progress=False, eval_episodes=0, constrained=False)
    assert read_config(tmp_path / "free")["config"]["cost_q_limit"] is None


@pytest.mark.parametrize(("limit", "rises"), [(-1.0, True), (1e6, False)])
def test_the_multiplier_rises_only_while_the_batch_q_c_exceeds_the_limit(limit, rises):
    buf = make_buffer()
    algo = SAC(
        3, 1, SACConfig(hidden=(16, 16), batch_size=32, cost_q_limit=limit, pid=PIDConfig(kp=0.0, ki=0.1))
    )
    for _ in range(5):
        m = algo.update(buf.sample(32))
    assert (m["lagrange_multiplier"] > 0.0) == rises, m


def test_the_cost_critic_target_is_floored_at_zero():
    """Costs are >= 0, so a bootstrapped cost value below 0 is clipped: the target is the cost itself."""
    batch = make_buffer().sample(32)
    algo = SAC(3, 1, SACConfig(hidden=(16, 16), batch_size=32))
    algo.cost_critic_target = lambda obs, act: torch.full((2, obs.shape[0]), -100.0)
    loss = algo.cost_critic_loss(batch, batch.act)
    with torch.no_grad():
        expected = td_loss(algo.cost_critic(batch.obs, batch.act), batch.cost)
    assert torch.allclose(loss, expected)


@pytest.mark.parametrize("algo", sorted(OFFLINE_CLASSES))
def test_every_offline_cost_critic_starts_at_the_datas_cost_to_go(algo):
    """Every step pays 1, so a row's discounted cost-to-go is a function of the steps its episode has left
    (the first observation entry): the cost networks start there, not at zero, and the target with them."""
    t = _paying([list(range(50))] * 8, length=50)
    t.obs[:, 0] = t.step / 50.0
    cls = OFFLINE_CLASSES[algo]
    cfg = cls.config_cls(hidden=(32, 32), batch_size=64)
    learner = held_to_budget(cls, cfg, pendulum_info(), t, constrained=False)
    nets = learner.networks()
    obs, act = torch.as_tensor(t.obs), torch.as_tensor(t.action / 2.0)
    cost_to_go = torch.as_tensor(mc_returns(t.cost, t.episode_end, cfg.gamma))
    with torch.no_grad():
        q = nets["cost_critic"](obs, act)
        assert torch.equal(q, nets["cost_critic_target"](obs, act))
        assert (q.mean(0) - cost_to_go).abs().mean() < 0.1 * cost_to_go.mean()
        if "cost_value" in nets:
            v = nets["cost_value"](obs, obs[:, :0])[0]
            assert (v - cost_to_go).abs().mean() < 0.1 * cost_to_go.mean()
