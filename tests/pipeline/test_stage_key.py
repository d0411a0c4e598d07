"""The pipeline's stage specs and cache key: the form is converted once into the library's configs, and a
stage is reused only when everything that determines its output is the same."""

import dataclasses

import pytest
import torch

from arl_models import nets
from arl_models.continual import ContinualConfig
from arl_models.online import FinetuneConfig
from arl_models.presets import get_preset
from flows.params import GateConfig, TrainingConfig
from tasks.registry import GATE
from tasks.stages import STAGES, offline_spec
from tasks.train import stage_key

MD5 = "0" * 32


def _keys(form: TrainingConfig | None = None) -> dict[str, str]:
    specs = (form or TrainingConfig()).stage_specs("safe-pendulum", forgetting_episodes=10)
    return {s: stage_key(specs[s], MD5, None) for s in STAGES}


def test_a_new_network_layout_retrains_every_cached_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _keys()
    assert _keys() == before and len(set(before.values())) == len(STAGES)
    built = nets.TanhGaussianActor.__init__

    def with_a_new_parameter(self, *args, **kwargs) -> None:  # a network that gained a weight
        built(self, *args, **kwargs)
        self.gate = torch.nn.Parameter(torch.zeros(2))

    monkeypatch.setattr(nets.TanhGaussianActor, "__init__", with_a_new_parameter)
    after = _keys()
    assert all(after[s] != before[s] for s in STAGES)


def test_settings_data_upstream_and_inputs_are_part_of_the_key() -> None:
    spec = offline_spec("demo", 0, "safe-pendulum")
    key = stage_key(spec, MD5, None)
    assert stage_key(offline_spec("demo", 1, "safe-pendulum"), MD5, None) != key
    assert stage_key(offline_spec("demo", 0, "safe-pendulum", steps=7), MD5, None) != key
    assert stage_key(offline_spec("demo", 0, "safe-pendulum", constrained=False), MD5, None) != key
    assert stage_key(spec, MD5, "upstream") != key
    assert stage_key(spec, "1" * 32, None) != key
    assert stage_key(spec, MD5, None, inputs=["a"]) != key
    assert stage_key(offline_spec("demo", 0, "safe-pendulum", algo="td3bc"), MD5, None) != stage_key(
        offline_spec("demo", 0, "safe-pendulum", algo="iql"), MD5, None
    )


def test_threads_change_speed_not_the_key() -> None:
    assert _keys(TrainingConfig(threads=2)) == _keys()
    assert _keys(TrainingConfig(finetune_envs=2))["finetune"] != _keys()["finetune"]


def test_an_empty_form_is_the_librarys_defaults() -> None:
    specs = TrainingConfig().stage_specs("safe-pendulum@1.1.0", forgetting_episodes=GATE.eval_episodes)
    p = get_preset("demo")
    assert specs["bc"].config == p.bc and specs["bc"].steps == p.bc_steps
    assert specs["offline"].algo == p.offline_algo == "cql" and specs["offline"].config == p.offline_config(
        "cql"
    )
    library = FinetuneConfig(steps=p.finetune_steps, eval_episodes=p.eval_episodes)
    assert specs["finetune"].config == library
    ewc = specs["ewc"].config
    assert ewc.rehearsal == ContinualConfig.rehearsal and ewc.ewc.weight == ContinualConfig().ewc.weight
    assert ewc.finetune == library and ewc.online_steps == p.finetune_steps
    gate = GateConfig()
    assert {f.name: getattr(gate, f.name) for f in dataclasses.fields(GATE)} == dataclasses.asdict(GATE)


def test_the_form_overrides_only_what_it_gives() -> None:
    form = TrainingConfig(finetune_envs=2, finetune_vector="async", rehearsal=0.25, ewc_weight=3)
    specs = form.stage_specs("safe-pendulum", 5)
    ft = specs["finetune"].config
    assert (ft.num_envs, ft.vector, ft.cost_margin) == (2, "async", FinetuneConfig.cost_margin)
    assert specs["ewc"].config.rehearsal == 0.25 and specs["ewc"].config.ewc.weight == 3
    assert specs["ewc"].config.eval_episodes == 5


def test_stage_2_is_the_algorithm_measured_best_on_the_task() -> None:
    p = get_preset("demo")
    algo = {
        t: TrainingConfig().stage_specs(t, 10)["offline"].algo for t in ("safe-pendulum", "safe-hopper@1.0.0")
    }
    assert algo == {"safe-pendulum": "cql", "safe-hopper@1.0.0": "td3bc"}
    spec = TrainingConfig().stage_specs("safe-walker2d", 10)["offline"]
    assert (spec.algo, spec.steps, spec.config) == ("iql", p.offline_steps["iql"], p.iql)
    assert TrainingConfig(offline_algo="rebrac").stage_specs("safe-hopper", 10)["offline"].algo == "rebrac"
