"""The online replay's writer: rows as they arrive, Monte-Carlo returns when their episode ends."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from arl_models.algos.calql import mc_returns
from arl_models.prioritized import PrioritizedReplay
from arl_models.replay import ReplayBuffer


class OnlineWriter:
    """Puts experience into the online replay as it arrives and fills in each row's Monte-Carlo return
    (Cal-QL's bound) when its episode ends; until then the row's return is ``-inf``, which bounds nothing.

    Rows are written the step they happen, not at their episode's end, so the next update can draw
    them: with ``n`` environments stepping together, whole episodes would reach the batches about ``n``
    times as many updates later. Both loops write through one writer: the synchronous one a step at a
    time, the asynchronous one a poll's chunks at a time. ``add`` numbers rows in arrival order;
    ``extend`` takes one environment's rows by those numbers. A row the ring has overwritten before its
    episode ended gets no return (the slot holds a newer row), nor do the rows of episodes open when an
    asynchronous run was checkpointed (a resumed run does not continue them); synchronous rounds end on
    whole episodes, so their checkpoints hold none open.
    """

    def __init__(self, online: ReplayBuffer | PrioritizedReplay, mc: torch.Tensor, gamma: float):
        self.online, self.mc, self.gamma = online, mc, gamma
        self.added = 0  # rows written through this writer; the last of them sits just before online.ptr
        self.open: dict[Any, tuple[list[np.ndarray], list[np.ndarray]]] = {}

    def add(self, rows: dict[str, np.ndarray]) -> np.ndarray:
        """Append rows (``obs``, ``act``, ``rew``, ``cost``, ``next_obs``, ``done`` = terminated); returns
        their numbers, for :meth:`extend`."""
        self.mc[self.online.add(**rows)] = float("-inf")
        n = len(rows["rew"])
        numbers = np.arange(self.added, self.added + n)
        self.added += n
        return numbers

    def extend(self, key: Any, numbers: np.ndarray, rew: np.ndarray, end: np.ndarray) -> None:
        """Rows of one environment (``key``), in order: extend its open episode and close those that end."""
        nums, rews = self.open.setdefault(key, ([], []))
        lo = 0
        for hi in np.flatnonzero(end) + 1:
            nums.append(numbers[lo:hi])
            rews.append(rew[lo:hi])
            self._close(nums, rews)
            lo = int(hi)
        if lo < len(rew):
            nums.append(numbers[lo:])
            rews.append(rew[lo:])

    def _close(self, nums: list[np.ndarray], rews: list[np.ndarray]) -> None:
        r, n = np.concatenate(rews), np.concatenate(nums)
        ends = np.zeros(len(r), bool)
        ends[-1] = True
        g = mc_returns(r, ends, self.gamma)
        held = n >= self.added - self.online.capacity  # the ring still holds them, row r at ptr - (added - r)
        slots = torch.as_tensor((n[held] - self.added + self.online.ptr) % self.online.capacity)
        self.mc[slots] = torch.as_tensor(g[held], dtype=self.mc.dtype)
        nums.clear()
        rews.clear()
