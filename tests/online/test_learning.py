"""An honest learning test: constrained fine-tuning on safe-pendulum beats the offline policy it starts
from (measured in the same test) while the training episodes' cost stays near the budget."""

from __future__ import annotations

import json

import numpy as np
import pytest

from arl_models.algos.cql import CQLConfig
from arl_models.data.behaviour import RANDOM_POLICY_HASH
from arl_models.data.dataset import write_dataset
from arl_models.data.recorder import rollout
from arl_models.envs.registry import get_task
from arl_models.offline import train_cql
from arl_models.online import FinetuneConfig, finetune
from tests.conftest import pendulum_info


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_finetuning_improves_on_the_offline_policy_within_budget(tmp_path):
    spec = get_task("safe-pendulum")
    rng = np.random.default_rng(0)
    t = rollout(
        lambda o: rng.uniform(-2.0, 2.0, (1,)).astype(np.float32), spec, 2000, 0, RANDOM_POLICY_HASH, False
    )
    write_dataset(tmp_path / "random", t, pendulum_info())
    cql = CQLConfig(hidden=(64, 64), batch_size=128, n_action_samples=2, actor_lr=3e-4, temp_lr=3e-4)
    train_cql(tmp_path / "random", tmp_path / "cql", steps=300, config=cql, progress=False, eval_episodes=0)
    cfg = FinetuneConfig(
        steps=10_000, num_envs=4, utd=1.0, offline_ratio=0.25, eval_every=0, eval_episodes=5, batch_size=128
    )
    final = finetune(tmp_path / "cql", tmp_path / "ft", config=cfg, progress=False)
    offline, online = final["online/initial_return"], final["eval/return"]
    assert online - offline >= 0.2 * abs(offline), (offline, online)
    eps = [json.loads(ln) for ln in (tmp_path / "ft" / "episodes.jsonl").read_text().splitlines()]
    late = np.array([e["cost"] for e in eps[-16:]])  # the last four rounds
    assert np.median(late) <= 1.5 * spec.cost_budget, late
    assert (late > 2.0 * spec.cost_budget).mean() <= 0.25, late  # occasional spinning episodes, not the rule
