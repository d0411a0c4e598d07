"""What one environment worker does, the same in a process and in a Ray actor.

A :class:`Collector` owns ``envs_per_worker`` environments of one task and a copy of the actor
(:class:`~arl_models.nets.TanhGaussianActor`). :meth:`Collector.collect` steps all its environments
``chunk_steps`` times with one batched policy call per step and returns a :class:`Chunk`: the
transitions, the episodes that ended inside it, the policy version that acted, the data-version
metadata and timing counters. Episodes run on across chunks; a finished one resets at once.

Everything random is derived from ``(seed, worker, incarnation)``: the environments' reset seeds and
the action noise (a private torch generator), so the same worker with the same weights produces the
same data wherever it runs. A replacement of a dead worker is a new incarnation: a fresh stream, and
chunks keyed by ``(worker, incarnation, seq)`` never collide with the dead one's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from arl_models.data.dataset import utc_now_iso
from arl_models.data.recorder import policy_hash
from arl_models.envs.registry import get_task, make_env
from arl_models.nets import TanhGaussianActor
from arl_models.replay import ActionScaler


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build its environments and its copy of the actor (picklable)."""

    task: str
    """Task key ``name@env_version``."""
    obs_dim: int
    act_dim: int
    hidden: tuple[int, ...]
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    seed: int = 0
    chunk_steps: int = 64
    """Steps of every environment per chunk (a chunk has ``chunk_steps * envs_per_worker`` rows)."""
    envs_per_worker: int = 1
    context_dim: int = 0
    """The actor's FiLM context (``SACConfig.context_dim``)."""

    def stream_seed(self, worker: int, incarnation: int) -> int:
        return (self.seed * 1_000_003 + worker * 10_007 + incarnation * 101) % (2**31)


def actor_size(spec: WorkerSpec) -> int:
    """Number of float32 values in the actor's flat weights."""
    return sum(
        p.numel()
        for p in TanhGaussianActor(spec.obs_dim, spec.act_dim, spec.hidden, spec.context_dim)
        .state_dict()
        .values()
    )


def flatten(state: dict[str, torch.Tensor]) -> np.ndarray:
    """An actor's weights as one float32 vector (state_dict order)."""
    return torch.cat([t.detach().reshape(-1).float().cpu() for t in state.values()]).numpy()


@dataclass
class Chunk:
    """A worker's output: ``n`` transitions (actions normalised to [-1, 1]) plus bookkeeping."""

    worker: int
    incarnation: int
    seq: int
    policy_version: int
    obs: np.ndarray
    act: np.ndarray
    rew: np.ndarray
    cost: np.ndarray
    next_obs: np.ndarray
    term: np.ndarray
    episode_end: np.ndarray
    """Rows that end an episode (terminated or truncated); rows of one environment are contiguous."""
    episodes: list[tuple[float, float, int]]
    """``(return, cost, length)`` of every episode that ended in this chunk."""
    meta: dict[str, object]
    """Data-version metadata of the rows: ``env_version``, ``policy_hash``, ``random_seed``, ``timestamp``."""
    env_steps: int
    inference_calls: int
    step_time_s: float = 0.0
    inference_time_s: float = 0.0
    env_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Which of the worker's environments each row came from."""

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.worker, self.incarnation, self.seq)

    def __len__(self) -> int:
        return len(self.rew)


class Collector:
    """A worker's environments, actor and episode state."""

    def __init__(self, spec: WorkerSpec, worker: int, incarnation: int = 0):
        torch.set_num_threads(1)  # one core per worker: intra-op threads would fight the others
        self.spec, self.worker, self.incarnation = spec, worker, incarnation
        task = get_task(spec.task)
        self.env_version = task.env_version
        self.envs = [make_env(task) for _ in range(spec.envs_per_worker)]
        self.actor = TanhGaussianActor(spec.obs_dim, spec.act_dim, spec.hidden, spec.context_dim)
        self.scaler = ActionScaler.of(spec.action_low, spec.action_high)
        self.seed = spec.stream_seed(worker, incarnation)
        self.gen = torch.Generator().manual_seed(self.seed)
        self.resets = 0
        self.version, self.hash = -1, ""
        self.seq = 0
        n = spec.envs_per_worker
        self.obs = np.stack([self._reset(i) for i in range(n)])
        self.ret, self.cst, self.len = np.zeros(n), np.zeros(n), np.zeros(n, np.int64)

    def _reset(self, i: int) -> np.ndarray:
        obs, _ = self.envs[i].reset(seed=self.seed + self.resets)
        self.resets += 1
        return np.asarray(obs, np.float32)

    def load(self, flat: np.ndarray, version: int) -> None:
        """Take the learner's weights (flat float32, :func:`flatten` order) as policy ``version``."""
        state = self.actor.state_dict()
        offset = 0
        for k, t in state.items():
            state[k] = torch.from_numpy(np.array(flat[offset : offset + t.numel()], np.float32)).reshape(
                t.shape
            )
            offset += t.numel()
        self.actor.load_state_dict(state)
        self.version, self.hash = version, policy_hash(state)

    @torch.no_grad()
    def _act(self, obs: np.ndarray) -> np.ndarray:
        mu, log_std = self.actor.dist_params(torch.from_numpy(obs))
        u = mu + log_std.exp() * torch.randn(mu.shape, generator=self.gen)
        return torch.tanh(u).numpy()

    def collect(self) -> Chunk:
        if self.version < 0:
            raise RuntimeError("collect() before the first weights arrived (call load first)")
        s, n = self.spec, self.spec.envs_per_worker
        rows: list[list[tuple]] = [[] for _ in range(n)]
        episodes: list[tuple[float, float, int]] = []
        t_inf = t_env = 0.0
        for _ in range(s.chunk_steps):
            t0 = time.perf_counter()
            act = self._act(self.obs)
            t1 = time.perf_counter()
            t_inf += t1 - t0
            env_act = self.scaler.unnormalize(act)
            for i, env in enumerate(self.envs):
                nxt, r, term, trunc, info = env.step(env_act[i])
                nxt = np.asarray(nxt, np.float32)
                c = float(info.get("cost", 0.0))
                end = bool(term or trunc)
                rows[i].append((self.obs[i].copy(), act[i], float(r), c, nxt, float(term), end))
                self.ret[i] += r
                self.cst[i] += c
                self.len[i] += 1
                if end:
                    episodes.append((float(self.ret[i]), float(self.cst[i]), int(self.len[i])))
                    self.ret[i] = self.cst[i] = self.len[i] = 0
                    nxt = self._reset(i)
                self.obs[i] = nxt
            t_env += time.perf_counter() - t1
        flat = [r for per_env in rows for r in per_env]
        cols = list(zip(*flat, strict=True))
        chunk = Chunk(
            worker=self.worker,
            incarnation=self.incarnation,
            seq=self.seq,
            policy_version=self.version,
            obs=np.stack(cols[0]),
            act=np.stack(cols[1]).astype(np.float32),
            rew=np.asarray(cols[2], np.float32),
            cost=np.asarray(cols[3], np.float32),
            next_obs=np.stack(cols[4]),
            term=np.asarray(cols[5], np.float32),
            episode_end=np.asarray(cols[6], bool),
            episodes=episodes,
            env_steps=len(flat),
            inference_calls=s.chunk_steps,
            meta={
                "env_version": self.env_version,
                "policy_hash": self.hash,
                "random_seed": self.seed,
                "timestamp": utc_now_iso(),
            },
            step_time_s=t_env,
            inference_time_s=t_inf,
            env_index=np.repeat(np.arange(n), s.chunk_steps),
        )
        self.seq += 1
        return chunk

    def close(self) -> None:
        for env in self.envs:
            env.close()
