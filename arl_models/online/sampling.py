"""Batches mixing the offline dataset and the online replay (Ball et al. 2023, "RLPD": symmetric
sampling), with each row's Monte-Carlo return for Cal-QL's bound."""

from __future__ import annotations

from pathlib import Path

import torch

from arl_models.algos.calql import MCBatch, mc_returns
from arl_models.data.dataset import read_dataset
from arl_models.prioritized import PrioritizedReplay
from arl_models.replay import ActionScaler, ReplayBuffer


def sample_mixed(
    offline: ReplayBuffer,
    online: ReplayBuffer | PrioritizedReplay,
    batch_size: int,
    offline_ratio: float,
    offline_mc: torch.Tensor | None = None,
    online_mc: torch.Tensor | None = None,
) -> MCBatch:
    """Exactly ``round(ratio * B)`` offline rows followed by ``B - round(ratio * B)`` online rows."""
    return _draw_mixed(offline, online, batch_size, offline_ratio, offline_mc, online_mc)[0]


def sample_mixed_prioritized(
    offline: ReplayBuffer,
    online: PrioritizedReplay,
    batch_size: int,
    offline_ratio: float,
    offline_mc: torch.Tensor | None = None,
    online_mc: torch.Tensor | None = None,
) -> tuple[MCBatch, torch.Tensor, torch.Tensor]:
    """As :func:`sample_mixed` with the online rows drawn by priority: ``(batch, idx, weights)``, where
    ``idx`` are the slots of the batch's last ``len(idx)`` rows and ``weights`` ``(B,)`` is 1 on the
    offline rows and the IS weight on the online ones."""
    batch, per = _draw_mixed(offline, online, batch_size, offline_ratio, offline_mc, online_mc)
    idx, w_on = per if per is not None else (torch.zeros(0, dtype=torch.int64), torch.zeros(0))
    weights = torch.cat([torch.ones(batch_size - len(idx), device=w_on.device), w_on])
    return batch, idx, weights


def _draw_mixed(
    offline: ReplayBuffer,
    online: ReplayBuffer | PrioritizedReplay,
    batch_size: int,
    offline_ratio: float,
    offline_mc: torch.Tensor | None,
    online_mc: torch.Tensor | None,
) -> tuple[MCBatch, tuple[torch.Tensor, torch.Tensor] | None]:
    n_off = int(round(offline_ratio * batch_size))
    parts, mcs = [], []
    per = None
    for buf, mc, n in ((offline, offline_mc, n_off), (online, online_mc, batch_size - n_off)):
        if n == 0:
            continue
        if isinstance(buf, PrioritizedReplay):
            idx, w = buf.sample_indices(n)
            per = (idx, w)
        else:
            idx = torch.randint(0, len(buf), (n,), device=buf.device)
        parts.append(buf.gather(idx))
        mcs.append(None if mc is None else mc.index_select(0, idx))
    keys = ("obs", "act", "rew", "cost", "next_obs", "done")
    fields = {k: torch.cat([getattr(p, k) for p in parts]) for k in keys}
    mc_all = None if any(m is None for m in mcs) else torch.cat(mcs)  # type: ignore[arg-type]
    return MCBatch(**fields, mc_return=mc_all), per


def offline_buffer(path: str | Path, scaler: ActionScaler, gamma: float) -> tuple[ReplayBuffer, torch.Tensor]:
    """The dataset at ``path`` as a replay, with each row's discounted Monte-Carlo return ``(N,)``."""
    t, _ = read_dataset(path)
    buf = ReplayBuffer.from_transitions(t, scaler)
    return buf, torch.as_tensor(mc_returns(t.reward, t.episode_end, gamma))
