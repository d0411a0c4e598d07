"""The pipeline's cache key: a stage is reused only when everything that determines its output is the same."""

import pytest
import torch

from arl_models import nets
from tasks.train import stage_key

STAGES = ("bc", "offline", "finetune", "ewc")
SETTINGS = {"preset": "demo", "seed": 0, "steps": None}


def _keys() -> dict[str, str]:
    return {s: stage_key(s, "0" * 32, SETTINGS, None) for s in STAGES}


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


def test_settings_and_upstream_are_part_of_the_key() -> None:
    key = stage_key("offline", "0" * 32, SETTINGS, None)
    assert stage_key("offline", "0" * 32, SETTINGS | {"seed": 1}, None) != key
    assert stage_key("offline", "0" * 32, SETTINGS, "upstream") != key
    assert stage_key("offline", "1" * 32, SETTINGS, None) != key


def test_the_offline_algorithm_is_part_of_the_key() -> None:
    default = stage_key("offline", "0" * 32, SETTINGS, None)
    assert (
        stage_key("offline", "0" * 32, SETTINGS | {"offline_algo": "cql"}, None) != default
    )  # the choice is recorded
    assert stage_key("offline", "0" * 32, SETTINGS | {"offline_algo": "td3bc"}, None) != stage_key(
        "offline", "0" * 32, SETTINGS | {"offline_algo": "iql"}, None
    )
