"""Observation preprocessing on the learner: the built-in augmentations do what they say, batched."""

from __future__ import annotations

import pytest
import torch

from arl_models.preprocess import ObsStats, make_preprocessor
from arl_models.replay import Batch


def _batch(n: int, obs_dim: int = 3, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, obs_dim, generator=g) * torch.tensor([1.0, 5.0, 0.0])[:obs_dim] + 2.0
    return Batch(
        obs=obs,
        act=torch.rand(n, 1, generator=g),
        rew=torch.rand(n, generator=g),
        cost=torch.rand(n, generator=g),
        next_obs=obs + 0.1,
        done=torch.zeros(n),
    )


def test_amplitude_scales_each_row_and_its_next_obs_by_one_factor_in_range():
    torch.manual_seed(0)
    b = _batch(4096)
    out = make_preprocessor("amplitude", 0.2, ObsStats.of(b.obs))(b)
    z = out.obs[:, 0] / b.obs[:, 0]
    assert torch.allclose(out.obs, b.obs * z[:, None], rtol=1e-5)
    assert torch.allclose(out.next_obs, b.next_obs * z[:, None], rtol=1e-5)
    assert 0.8 <= z.min() < 0.81 and 1.19 < z.max() <= 1.2  # uniform over the whole interval
    for k in ("act", "rew", "cost", "done"):
        assert getattr(out, k) is getattr(b, k)


def test_noise_has_the_configured_std_per_dimension_and_independent_draws():
    torch.manual_seed(0)
    b = _batch(20_000)
    stats = ObsStats.of(b.obs)
    out = make_preprocessor("noise", 0.1, stats)(b)
    d, d2 = out.obs - b.obs, out.next_obs - b.next_obs
    assert torch.allclose(d[:, :2].std(0), 0.1 * stats.std[:2], rtol=0.03)
    assert d[:, :2].mean(0).abs().max() < 0.01 * stats.std[:2].max()
    assert torch.equal(d[:, 2], torch.zeros(len(b.obs)))  # a constant dimension gets no noise
    corr = torch.corrcoef(torch.stack([d[:, 1], d2[:, 1]]))[0, 1]
    assert abs(float(corr)) < 0.03


def test_same_seed_same_draws():
    b = _batch(64)
    p = make_preprocessor("noise", 0.5, ObsStats.of(b.obs))
    torch.manual_seed(3)
    first = p(b).obs
    torch.manual_seed(3)
    assert torch.equal(p(b).obs, first)


def test_names_and_scales_are_checked():
    stats = ObsStats.of(torch.zeros(4, 3))
    assert make_preprocessor("none", 0.1, stats) is None
    with pytest.raises(ValueError, match="unknown preprocess 'crop'.*amplitude, noise"):
        make_preprocessor("crop", 0.1, stats)
    with pytest.raises(ValueError, match="amplitude scale"):
        make_preprocessor("amplitude", 1.5, stats)
