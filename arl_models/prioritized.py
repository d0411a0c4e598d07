"""Prioritised experience replay with a freshness term, over a compiled K-ary sum tree (``sum_tree.py``).

Schaul, Quan, Antonoglou and Silver, "Prioritized Experience Replay" (ICLR 2016), the proportional
variant, with a freshness factor that favours newer transitions.

**The sampling distribution.** Item ``i`` of the filled buffer is drawn with probability

    P(i) = p_i^alpha * exp(freshness * c_i)  /  sum_j p_j^alpha * exp(freshness * c_j)

i.i.d., with replacement, ``B`` draws per call (returned in ascending slot order: a sorted i.i.d.
sample, which walks the tree and the rows in memory order). ``p_i = |delta_i| + eps`` after the learner
reported a TD error ``delta_i`` for it (:meth:`PrioritizedReplay.update_priorities`); a new transition
enters with ``p_i = max_priority``, the largest ``p`` ever assigned (1 before any update). ``c_i`` is the
item's insertion counter: the number of transitions added to the buffer before it (0, 1, 2, ... over the
buffer's whole life, overwritten slots included). So a transition inserted ``k`` transitions before
another, at equal ``p``, is drawn ``exp(-freshness * k)`` times as often: ``freshness = ln 2 / h`` halves
the weight every ``h`` insertions, and ``freshness = 0`` is plain PER. With equal ``p`` over ``N`` items
the newest ``k`` take the share ``(1 - exp(-freshness * k)) / (1 - exp(-freshness * N))``.

The tree stores ``p_i^alpha * exp(freshness * (c_i - c_ref))``: relative freshness is fixed at insertion
and never needs a sweep as items age. When ``freshness * (counter - c_ref)`` passes
:data:`RESCALE_EXPONENT`, every leaf is multiplied by ``exp(-freshness * (counter - c_ref))``, the tree is
rebuilt (one compiled pass) and ``c_ref`` moves to ``counter``; probabilities are unchanged (items
more than about 700 / freshness insertions older than the newest underflow to probability 0).

**Importance-sampling weights** ``w_i = (N * P(i))^-beta / max_j (N * P(j))^-beta``, where the maximum is
over the whole buffer (``normalize="buffer"``, Schaul et al.: the item of minimum probability, kept by a
min tree) or over the batch (``normalize="batch"``). ``N`` cancels: ``w_i = (P(i) / P_min)^-beta``. ``P``
is the full sampling probability, freshness included, so with ``beta -> 1`` the weights undo the freshness
bias as well as the TD bias. ``beta`` optionally anneals linearly to ``beta_final`` over ``beta_steps``
calls to :meth:`~PrioritizedReplay.sample`.

Draws use the replay's own PCG64 generator, seeded with ``PERConfig.seed`` or else torch's initial seed
(so runs are reproducible with ``torch.manual_seed``) and saved in :meth:`~PrioritizedReplay.state_dict`,
so a run resumes exactly from a checkpoint; or the torch generator given to ``sample``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from arl_models.replay import Batch, ReplayBuffer
from arl_models.sum_tree import SumTree, leaf_values

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
    """Children per node of the sum tree (``sum_tree.py``; 2 is the classic binary tree)."""
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
        "bit_generator": "PCG64",
        "state": {"state": w[0] | (w[1] << 64), "inc": w[2] | (w[3] << 64)},
        "has_uint32": w[4],
        "uinteger": w[5],
    }


def _host(t: torch.Tensor, dtype: type) -> np.ndarray:
    """A tensor as a contiguous numpy array of ``dtype`` (a view where it already is one)."""
    if t.requires_grad:
        t = t.detach()
    if not t.is_cpu:
        t = t.cpu()
    return np.ascontiguousarray(t.numpy(), dtype=dtype)


class PrioritizedReplay:
    """A :class:`~arl_models.replay.ReplayBuffer` sampled by priority and freshness (see the module doc).

    It holds the buffer (``.buffer``) and exposes the parts the loops use (``add``, ``gather``,
    ``len``, ``ptr``, ``capacity``, ``device``); ``sample`` returns the batch, the slots drawn and
    their importance-sampling weights. Draws use the replay's own PCG64 generator (seeded with
    ``cfg.seed``, else torch's initial seed; saved in :meth:`state_dict`) unless a torch generator is given.
    """

    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        act_dim: int,
        cfg: PERConfig = PERConfig(),
        device: str | torch.device = "cpu",
    ):
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
        # a numpy view of the rows: ``take`` gathers a batch in about half the time of ``index_select``
        self._rows = buffer.rows.numpy() if buffer.device.type == "cpu" else None

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
        rows = self._rows.take(idx.numpy(), axis=0)
        return Batch(**{k: torch.from_numpy(rows[:, c]) for k, c in self.buffer.columns.items()})

    # ---- priorities -------------------------------------------------------------------------------
    def _leaf(self, p: np.ndarray, c: np.ndarray) -> np.ndarray:
        """``p^alpha * exp(freshness * (c - c_ref))`` for base priorities ``p`` and counters ``c``."""
        return leaf_values(p, c, float(self.cfg.alpha), float(self.cfg.freshness), self.ref)

    def _rescale_if_needed(self) -> None:
        lam = self.cfg.freshness
        if not lam or lam * (self.counter - self.ref) <= RESCALE_EXPONENT:
            return
        self.tree.sums[0][: len(self)] *= math.exp(-lam * (self.counter - self.ref))
        self.ref = self.counter
        self.tree.rebuild()

    def add(self, **arrays: np.ndarray) -> torch.Tensor:
        """Append rows as :meth:`ReplayBuffer.add` does, at the current max priority; returns the slots
        written."""
        n = len(arrays["rew"])
        idx_t = self.buffer.add(**arrays)
        idx = idx_t.cpu().numpy()
        c = (
            self.counter + (n - len(idx)) + np.arange(len(idx), dtype=np.int64)
        )  # rows beyond capacity dropped
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
        i, td = _host(idx, np.int64), _host(td_error, np.float64)
        if i.shape != td.shape or i.ndim != 1:
            raise ValueError("update_priorities: idx and td_error must be 1-d and of one length")
        c = self.cfg
        p_max = self.tree.set_priorities(
            i, td, float(c.eps), float(c.alpha), float(c.freshness), self.ref, self.inserted
        )
        self.max_priority = max(self.max_priority, p_max)

    def probabilities(self) -> torch.Tensor:
        """``P(i)`` of every filled slot ``(N,)``, float64."""
        return torch.from_numpy(self.tree.leaves[: len(self)] / self.tree.total())

    def beta(self) -> float:
        c = self.cfg
        if c.beta_final is None:
            return c.beta
        return c.beta + (c.beta_final - c.beta) * min(1.0, self.samples / c.beta_steps)

    def sample_indices(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` slots drawn from ``P`` and their IS weights (float32), on the buffer's device."""
        n = len(self)
        if n == 0:
            raise ValueError("PrioritizedReplay.sample: the buffer is empty")
        if generator is None:
            r = self.rng.random(batch_size)
        else:
            r = torch.rand(batch_size, dtype=torch.float64, generator=generator).numpy()
        r.sort()  # ascending draws walk the tree (and the rows) in memory order
        idx, w = self.tree.sample(r, n, float(self.beta()), self.cfg.normalize == "batch")
        self.samples += 1
        idx_t, w_t = torch.from_numpy(idx), torch.from_numpy(w)
        if self._rows is None:  # rows on an accelerator
            idx_t, w_t = idx_t.to(self.device), w_t.to(self.device)
        return idx_t, w_t

    def sample(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> tuple[Batch, torch.Tensor, torch.Tensor]:
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
