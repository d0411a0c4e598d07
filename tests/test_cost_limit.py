"""The offline constraint: the undiscounted episode budget as a limit on the discounted ``Q_c``, the
multiplier that holds it, and the cost critic's floor."""

import numpy as np
import pytest
import torch

from arl_models.algos.sac import SAC, SACConfig, td_loss
from arl_models.checkpoint import read_config
from arl_models.data import read_info
from arl_models.lagrange import PIDConfig
from arl_models.offline import cql_cost_limit, train_cql
from tests.conftest import make_buffer, pendulum_info


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
    assert cql_cost_limit(info, 0.99, 1000) == pytest.approx(0.1 * info.cost_budget, rel=1e-3)  # hopper's horizon
    assert cql_cost_limit(info, 0.0) == pytest.approx(info.cost_budget / 200)  # undiscounted: one step's share


def test_constrained_cql_is_held_to_that_limit(tiny_dataset, tmp_path):
    train_cql(tiny_dataset, tmp_path / "cql", steps=2, progress=False, eval_episodes=0)
    cfg = read_config(tmp_path / "cql")["config"]
    expected = cql_cost_limit(read_info(tiny_dataset), cfg["gamma"])
    assert np.isclose(cfg["cost_q_limit"], expected)
    train_cql(tiny_dataset, tmp_path / "free", steps=2, progress=False, eval_episodes=0, constrained=False)
    assert read_config(tmp_path / "free")["config"]["cost_q_limit"] is None


@pytest.mark.parametrize(("limit", "rises"), [(-1.0, True), (1e6, False)])
def test_the_multiplier_rises_only_while_the_batch_q_c_exceeds_the_limit(limit, rises):
    buf = make_buffer()
    algo = SAC(3, 1, SACConfig(hidden=(16, 16), batch_size=32, cost_q_limit=limit, pid=PIDConfig(kp=0.0, ki=0.1)))
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
