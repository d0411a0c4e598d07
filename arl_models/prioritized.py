"""Prioritised experience replay with a freshness term, over a vectorised sum tree.

Schaul, Quan, Antonoglou and Silver, "Prioritized Experience Replay" (ICLR 2016), the proportional
variant, with a freshness factor that favours newer transitions.

**The sampling distribution.** Item ``i`` of the filled buffer is drawn with probability

    P(i) = p_i^alpha * exp(freshness * c_i)  /  sum_j p_j^alpha * exp(freshness * c_j)

i.i.d., with replacement, ``B`` draws per call (returned in ascending slot order: a sorted i.i.d.
sample, which walks the tree and the rows in memory order). ``p_i = |delta_i| + eps`` after the learner reported a
TD error ``delta_i`` for it (:meth:`PrioritizedReplay.update_priorities`); a new transition enters with
``p_i = max_priority``, the largest ``p`` ever assigned (1 before any update). ``c_i`` is the item's
insertion counter: the number of transitions added to the buffer before it (0, 1, 2, ... over the
buffer's whole life, overwritten slots included). So a transition inserted ``k`` transitions before
another, at equal ``p``, is drawn ``exp(-freshness * k)`` times as often: ``freshness = ln 2 / h`` halves
the weight every ``h`` insertions, and ``freshness = 0`` is plain PER. With equal ``p`` over ``N`` items
the newest ``k`` take the share ``(1 - exp(-freshness * k)) / (1 - exp(-freshness * N))``.

The tree stores ``p_i^alpha * exp(freshness * (c_i - c_ref))``: relative freshness is fixed at insertion
and never needs a sweep as items age. When ``freshness * (counter - c_ref)`` passes
:data:`RESCALE_EXPONENT`, every leaf is multiplied by ``exp(-freshness * (counter - c_ref))``, the tree is
rebuilt (one vectorised pass) and ``c_ref`` moves to ``counter``; probabilities are unchanged (items
more than about 700 / freshness insertions older than the newest underflow to probability 0).

**Importance-sampling weights** ``w_i = (N * P(i))^-beta / max_j (N * P(j))^-beta``, where the maximum is
over the whole buffer (``normalize="buffer"``, Schaul et al.: the item of minimum probability, kept by a
min tree) or over the batch (``normalize="batch"``). ``N`` cancels: ``w_i = (P(i) / P_min)^-beta``. ``P`` is
the full sampling probability, freshness included, so with ``beta -> 1`` the weights undo the freshness
bias as well as the TD bias. ``beta`` optionally anneals linearly to ``beta_final`` over ``beta_steps``
calls to :meth:`~PrioritizedReplay.sample`.

**The tree.** Levels of fan-out ``K`` (default 16) in contiguous float64 arrays: level 0 holds the
leaves, each entry above is the sum of its ``K`` children. Sampling ``B`` items is one descent for all
``B`` at once, ``ceil(log_K(capacity))`` vector steps (5 for a million items); a priority update writes
the leaves and recomputes only the touched ancestors, level by level. No Python loop runs per item.
Every inner node is always recomputed from its children by the same reduction, so a tree rebuilt from
its leaves (after loading a checkpoint) equals the incrementally updated one bit for bit.

Randomness comes from torch's generator (the global one unless given), so runs are reproducible with
``torch.manual_seed`` and resume exactly from a checkpoint that restores torch's RNG state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from arl_models.replay import Batch, ReplayBuffer

RESCALE_EXPONENT = 64.0
"""Largest freshness exponent ``freshness * (counter - c_ref)`` the leaves carry before a rescale."""
NORMALIZATIONS = ("buffer", "batch")


@dataclass(frozen=True)
class PERConfig:
    alpha: float = 0.6
    """Priority exponent: 0 is uniform (up to freshness), 1 fully proportional to ``|TD error| + eps``."""
    beta: float = 0.4
    """Importance-sampling exponent (at the start, when annealed)."""
    eps: float = 1e-6
    """Added to ``|TD error|`` so that no transition gets probability 0."""
    freshness: float = 0.0
    """Decay per inserted transition: an item ``k`` insertions older weighs ``exp(-freshness * k)``
    times as much (half-life ``ln 2 / freshness``); 0 is plain PER."""
    beta_final: float | None = None
    """With a value, ``beta`` anneals linearly to it over ``beta_steps`` calls to ``sample``."""
    beta_steps: int = 100_000
    normalize: str = "buffer"
    """IS weights divided by the buffer's largest weight (``buffer``, Schaul et al.) or the batch's."""
    fanout: int = 16
    """Children per node of the sum tree (2 is the classic binary tree; 16 is fastest here)."""
    seed: int | None = None
    """Seed of the replay's own generator; ``None`` takes torch's initial seed (``torch.manual_seed``)."""

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.eps <= 0 or self.freshness < 0:
            raise ValueError("PERConfig: need alpha >= 0, eps > 0, freshness >= 0")
        if not 0.0 <= self.beta <= 1.0 or (self.beta_final is not None and not 0.0 <= self.beta_final <= 1.0):
            raise ValueError("PERConfig: beta and beta_final must lie in [0, 1]")
        if self.normalize not in NORMALIZATIONS:
            raise ValueError(f"PERConfig.normalize must be one of {NORMALIZATIONS}, got {self.normalize!r}")
        if self.fanout < 2 or self.beta_steps < 1:
            raise ValueError("PERConfig: fanout >= 2 and beta_steps >= 1")


def half_life_freshness(half_life: float) -> float:
    """The ``freshness`` that halves a transition's weight every ``half_life`` insertions."""
    return math.log(2.0) / half_life


class SumTree:
    """Sums (and optionally minima) over ``capacity`` non-negative leaves: ``K`` children per node, and
    a flat top.

    ``sums[0]`` holds the leaves (padded to a multiple of ``K``) and ``sums[d + 1][m]`` the sum of
    ``sums[d][m * K : (m + 1) * K]``, up to the first level with at most ``top`` nodes; above it one
    prefix sum over that level per draw (a few thousand entries) stands in for the upper part of the
    tree, which saves a vector step per level in every draw and every update. ``mins[d]`` holds the
    minima of level ``d + 1`` over the positive leaves below it (a leaf of 0 is empty or has
    underflowed: it is never drawn, so it is not the minimum either). Children are always reduced in the
    order 0, 1, ..., K-1, whatever the batch, so a node's value never depends on the history of updates.
    """

    def __init__(self, capacity: int, fanout: int = 16, track_min: bool = True, top: int = 4096):
        if capacity < 1 or fanout < 2 or top < 1:
            raise ValueError("SumTree: need capacity >= 1, fanout >= 2 and top >= 1")
        self.capacity, self.k = capacity, fanout
        sizes, n = [], capacity
        while True:
            sizes.append(-(-n // fanout) * fanout)
            if n <= top:
                break
            n = -(-n // fanout)
        self.sums = [np.zeros(m) for m in sizes]
        self.mins = [np.full(m, np.inf) for m in sizes[1:]] if track_min else None
        # (K, K + 1): column c of ``children @ _bounds`` is the sum of the children before c (c = K: all)
        self._bounds = np.triu(np.ones((fanout, fanout + 1)), 1)
        self._prefix = np.zeros(len(self.sums[-1]) + 1)  # 0, then the top level's running sums

    def _top_ends(self) -> np.ndarray:
        np.cumsum(self.sums[-1], out=self._prefix[1:])
        return self._prefix[1:]

    def total(self) -> float:
        return float(self._top_ends()[-1])

    def min(self) -> float:
        """The smallest positive leaf (``inf`` when none is)."""
        assert self.mins is not None, "SumTree built without track_min"
        if self.mins:
            return float(self.mins[-1].min())
        leaves = self.sums[0]
        return float(leaves[leaves > 0].min(initial=np.inf))

    @property
    def leaves(self) -> np.ndarray:
        return self.sums[0][: self.capacity]

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``idx`` to ``values`` (``>= 0``; of duplicate indices the largest value wins) and
        recompute their ancestors, level by level."""
        leaves = self.sums[0]
        leaves[idx] = 0.0
        np.maximum.at(leaves, idx, values)
        for d in range(1, len(self.sums)):
            idx = idx // self.k  # duplicate parents are recomputed twice, to the same value
            self._recompute(d, idx)

    def rebuild(self) -> None:
        """Recompute every inner node from the leaves (the same reduction as :meth:`update`)."""
        for d in range(1, len(self.sums)):
            self._recompute(d, np.arange(len(self.sums[d - 1]) // self.k))

    def _recompute(self, d: int, idx: np.ndarray) -> None:
        # children as (K, n): a reduction over axis 0 adds child 0, 1, ... in turn, vectorised over n
        ch = np.ascontiguousarray(self.sums[d - 1].reshape(-1, self.k).take(idx, axis=0).T)
        self.sums[d][idx] = ch.sum(0)
        if self.mins is None:
            return
        if d == 1:
            ch[ch == 0.0] = np.inf
        else:
            ch = np.ascontiguousarray(self.mins[d - 2].reshape(-1, self.k).take(idx, axis=0).T)
        self.mins[d - 1][idx] = ch.min(0)

    def draw(self, r: np.ndarray) -> np.ndarray:
        """The leaf of each prefix sum ``u = r * total`` (``r`` in ``[0, 1)``, ``(B,)``): the ``i`` with
        ``sum(leaves[:i]) <= u < sum(leaves[:i + 1])``, for all ``B`` in one descent."""
        ends = self._top_ends()
        u = r * ends[-1]
        node = np.minimum(np.searchsorted(ends, u, side="right"), len(ends) - 1)
        u -= self._prefix.take(node)  # the start of each top node's range
        rows = np.arange(len(u)) * (self.k + 1)
        for d in range(len(self.sums) - 2, -1, -1):
            bounds = self.sums[d].reshape(-1, self.k).take(node, axis=0) @ self._bounds  # (B, K + 1)
            j = (bounds[:, 1:] <= u[:, None]).argmin(1)  # first child ending after u (0 if rounding put u past the end)
            u -= bounds.ravel().take(rows + j)
            node = node * self.k + j
        return node


class TDLearner(Protocol):
    """What :func:`prioritized_update` needs of an algorithm (SAC, CQL, Cal-QL)."""

    td_error: torch.Tensor | None

    def update(self, batch: Batch, weights: torch.Tensor | None = None) -> dict[str, float]: ...


def _rng_state(rng: np.random.Generator) -> torch.Tensor:
    """A PCG64 generator's state as int64 words (safetensors holds no Python ints)."""
    st = rng.bit_generator.state
    words = []
    for x in (st["state"]["state"], st["state"]["inc"]):
        words += [x & (2**64 - 1), x >> 64]
    words += [st["has_uint32"], st["uinteger"]]
    return torch.tensor(np.array(words, dtype=np.uint64).view(np.int64))


def _set_rng_state(rng: np.random.Generator, t: torch.Tensor) -> None:
    w = [int(x) for x in t.numpy().view(np.uint64)]
    rng.bit_generator.state = {
        "bit_generator": "PCG64", "state": {"state": w[0] | (w[1] << 64), "inc": w[2] | (w[3] << 64)},
        "has_uint32": w[4], "uinteger": w[5],
    }


class PrioritizedReplay:
    """A :class:`~arl_models.replay.ReplayBuffer` sampled by priority and freshness (see the module doc).

    It holds the buffer (``.buffer``) and exposes the parts the loops use (``add``, ``gather``,
    ``len``, ``ptr``, ``capacity``, ``device``); ``sample`` returns the batch, the slots drawn and
    their importance-sampling weights. Draws use the replay's own PCG64 generator (seeded with
    ``cfg.seed``, else torch's initial seed; saved in :meth:`state_dict`) unless a torch generator is given.
    """

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, cfg: PERConfig = PERConfig(),
                 device: str | torch.device = "cpu"):
        self._attach(ReplayBuffer(capacity, obs_dim, act_dim, device), cfg)

    @classmethod
    def from_buffer(cls, buffer: ReplayBuffer, cfg: PERConfig = PERConfig()) -> PrioritizedReplay:
        """Prioritise an already filled buffer (a dataset): its rows enter in storage order."""
        self = cls.__new__(cls)
        self._attach(buffer, cfg)
        n = len(buffer)
        if n:
            idx = np.arange(n, dtype=np.int64)
            self.inserted[idx] = idx
            self.counter = n
            self._rescale_if_needed()
            self.tree.update(idx, self._leaf(np.full(n, self.max_priority), idx))
        return self

    def _attach(self, buffer: ReplayBuffer, cfg: PERConfig) -> None:
        self.buffer, self.cfg = buffer, cfg
        self.tree = SumTree(buffer.capacity, cfg.fanout, track_min=cfg.normalize == "buffer")
        self.inserted = np.zeros(buffer.capacity, dtype=np.int64)  # insertion counter c_i per slot
        self.counter = 0  # transitions inserted so far
        self.ref = 0  # c_ref of the stored freshness factors
        self.max_priority = 1.0
        self.samples = 0  # calls to sample (beta annealing)
        self.rng = np.random.default_rng(torch.initial_seed() if cfg.seed is None else cfg.seed)
        # numpy views of the rows: ``take`` gathers a batch in about half the time of ``index_select``
        self._rows = {k: v.numpy() for k, v in buffer.data.items()} if buffer.device.type == "cpu" else None

    # ---- the buffer's face ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.buffer)

    @property
    def capacity(self) -> int:
        return self.buffer.capacity

    @property
    def ptr(self) -> int:
        return self.buffer.ptr

    @property
    def size(self) -> int:
        return self.buffer.size

    @property
    def device(self) -> torch.device:
        return self.buffer.device

    def gather(self, idx: torch.Tensor) -> Batch:
        if self._rows is None:
            return self.buffer.gather(idx)
        i = idx.numpy()
        return Batch(**{k: torch.from_numpy(v.take(i, axis=0)) for k, v in self._rows.items()})

    # ---- priorities -------------------------------------------------------------------------------
    def _leaf(self, p: np.ndarray, c: np.ndarray) -> np.ndarray:
        """``p^alpha * exp(freshness * (c - c_ref))`` for base priorities ``p`` and counters ``c``."""
        v = np.power(p, self.cfg.alpha)
        if self.cfg.freshness:
            v *= np.exp(self.cfg.freshness * (c - self.ref))
        return v

    def _rescale_if_needed(self) -> None:
        lam = self.cfg.freshness
        if not lam or lam * (self.counter - self.ref) <= RESCALE_EXPONENT:
            return
        self.tree.sums[0][: len(self)] *= math.exp(-lam * (self.counter - self.ref))
        self.ref = self.counter
        self.tree.rebuild()

    def add(self, **arrays: np.ndarray) -> torch.Tensor:
        """Append rows as :meth:`ReplayBuffer.add` does, at the current max priority; returns the slots written."""
        n = len(arrays["rew"])
        idx_t = self.buffer.add(**arrays)
        idx = idx_t.cpu().numpy()
        c = self.counter + (n - len(idx)) + np.arange(len(idx), dtype=np.int64)  # rows beyond capacity dropped
        self.counter += n
        self.inserted[idx] = c
        self._rescale_if_needed()
        self.tree.update(idx, self._leaf(np.full(len(idx), self.max_priority), c))
        return idx_t

    def update_priorities(self, idx: torch.Tensor, td_error: torch.Tensor) -> None:
        """Set ``p = |td_error| + eps`` for the slots ``idx`` (of duplicate slots the largest ``p`` wins).

        ``idx`` must come from the last :meth:`sample`: a slot overwritten by ``add`` in between would get
        the old row's priority.
        """
        if len(idx) == 0:
            return
        i = idx.detach().cpu().numpy().astype(np.int64, copy=False)
        p = np.abs(td_error.detach().cpu().numpy().astype(np.float64)) + self.cfg.eps
        self.max_priority = max(self.max_priority, float(p.max()))
        self.tree.update(i, self._leaf(p, self.inserted.take(i)))

    def probabilities(self) -> torch.Tensor:
        """``P(i)`` of every filled slot ``(N,)``, float64."""
        return torch.from_numpy(self.tree.leaves[: len(self)] / self.tree.total())

    def beta(self) -> float:
        c = self.cfg
        if c.beta_final is None:
            return c.beta
        return c.beta + (c.beta_final - c.beta) * min(1.0, self.samples / c.beta_steps)

    def sample_indices(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` slots drawn from ``P`` and their IS weights (float32), on the buffer's device."""
        n = len(self)
        if n == 0:
            raise ValueError("PrioritizedReplay.sample: the buffer is empty")
        if generator is None:
            r = self.rng.random(batch_size)
        else:
            r = torch.rand(batch_size, dtype=torch.float64, generator=generator).numpy()
        r.sort()  # ascending draws walk the tree (and the rows) in memory order: a third faster
        idx = np.minimum(self.tree.draw(r), n - 1)
        leaf = self.tree.sums[0].take(idx)
        low = self.tree.min() if self.cfg.normalize == "buffer" else leaf.min()
        w = np.power(leaf / low, -self.beta()).astype(np.float32)  # (P_i / P_min)^-beta
        self.samples += 1
        idx_t, w_t = torch.from_numpy(idx), torch.from_numpy(w)
        if self.device.type != "cpu":
            idx_t, w_t = idx_t.to(self.device), w_t.to(self.device)
        return idx_t, w_t

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[Batch, torch.Tensor, torch.Tensor]:
        """``(batch, idx, weights)``: rows drawn from ``P``, their slots and IS weights."""
        idx, w = self.sample_indices(batch_size, generator)
        return self.gather(idx), idx, w

    # ---- checkpoints ------------------------------------------------------------------------------
    def priority_state_dict(self) -> dict[str, torch.Tensor]:
        """Priorities, counters and the generator alone (safetensors-compatible), for a buffer whose
        rows are restored elsewhere (an offline dataset)."""
        n = len(self)
        return {
            "replay.per.leaves": torch.from_numpy(self.tree.leaves[:n].copy()),
            "replay.per.inserted": torch.from_numpy(self.inserted[:n].copy()),
            "replay.per.counters": torch.tensor([self.counter, self.ref, self.samples], dtype=torch.int64),
            "replay.per.max_priority": torch.tensor([self.max_priority], dtype=torch.float64),
            "replay.per.rng": _rng_state(self.rng),
        }

    def load_priority_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        leaves = state["replay.per.leaves"].numpy()
        n = len(leaves)
        if n != len(self):
            raise ValueError(f"priority state holds {n} items, the buffer {len(self)}")
        self.tree.sums[0][:] = 0.0
        self.tree.sums[0][:n] = leaves
        self.tree.rebuild()
        self.inserted[:] = 0
        self.inserted[:n] = state["replay.per.inserted"].numpy()
        self.counter, self.ref, self.samples = (int(x) for x in state["replay.per.counters"])
        self.max_priority = float(state["replay.per.max_priority"][0])
        _set_rng_state(self.rng, state["replay.per.rng"])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The buffer's rows and pointers plus the priorities, for checkpoints (safetensors-compatible)."""
        return self.buffer.state_dict() | self.priority_state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.buffer.load_state_dict(state)
        self.load_priority_state_dict(state)


def prioritized_update(algo: TDLearner, replay: PrioritizedReplay, batch_size: int) -> dict[str, float]:
    """One learner step on a prioritised batch: IS-weighted update, then the batch's new priorities."""
    batch, idx, w = replay.sample(batch_size)
    metrics = algo.update(batch, weights=w)
    assert algo.td_error is not None, "the algorithm did not expose per-sample TD errors"
    replay.update_priorities(idx, algo.td_error)
    return metrics
