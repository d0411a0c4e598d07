"""Fine-tuning starts from every stage-2 algorithm: TD3+BC, IQL and ReBRAC hand over the networks they share
with the online learner (actor, critics, cost critics; ReBRAC's critics with their LayerNorms)."""

from dataclasses import replace

import pytest
import torch

from arl_models.algos.iql import IQLConfig
from arl_models.algos.rebrac import ReBRACConfig
from arl_models.algos.td3bc import TD3BCConfig
from arl_models.checkpoint import load_policy, read_config
from arl_models.offline import train_offline_algo
from arl_models.online import FinetuneConfig, build_algo, finetune, warm_start

TINY = FinetuneConfig(steps=400, num_envs=2, vector="sync", utd=0.05, eval_episodes=0, batch_size=32)
CONFIGS = {
    "td3bc": TD3BCConfig(hidden=(16, 16), batch_size=32),
    "iql": IQLConfig(hidden=(16, 16), batch_size=32),
    "rebrac": ReBRACConfig(hidden=(16, 16), batch_size=32),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def start(request, tmp_path_factory, pendulum_data):
    out = tmp_path_factory.mktemp(request.param) / request.param
    train_offline_algo(
        request.param,
        pendulum_data,
        out,
        steps=20,
        config=CONFIGS[request.param],
        progress=False,
        eval_episodes=0,
    )
    return out


def test_warm_start_loads_the_shared_networks(start):
    rec = read_config(start)
    algo = build_algo(rec, TINY)
    assert algo.cfg.hidden == (16, 16) and algo.cfg.learn_cost
    carried = warm_start(algo, start, budget=12.0)
    assert set(carried) == {"integral", "prev", "value"}
    offline = load_policy(start).actor.state_dict()
    assert all(torch.equal(v, algo.actor.state_dict()[k]) for k, v in offline.items())
    from safetensors.torch import load_file

    weights = load_file(str(start / "weights.safetensors"))
    assert torch.equal(weights["cost_critic.out.weight"], algo.cost_critic.state_dict()["out.weight"])
    critic = algo.critic.state_dict()
    assert all(torch.equal(weights[f"critic.{k}"], v) for k, v in critic.items() if f"critic.{k}" in weights)
    assert (algo.critic.norms is not None) == (start.name == "rebrac")


def test_finetune_runs_from_the_checkpoint(start, tmp_path):
    final = finetune(start, tmp_path / "ft", config=replace(TINY, steps=200), progress=False)
    assert final["online/env_steps_total"] >= 200
    assert read_config(tmp_path / "ft")["from"] == str(start)
