"""Recording environment steps into :class:`Transitions`, and running a policy to collect them."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from arl_models.data.dataset import Transitions, with_metadata
from arl_models.envs.registry import TaskSpec, make_env


def policy_hash(state: dict[str, torch.Tensor]) -> str:
    """Hex SHA-256 of a policy's weights (names and bytes, in sorted order)."""
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class TransitionRecorder:
    """Appends single steps; :meth:`to_transitions` stacks them into contiguous arrays."""

    def __init__(self, first_episode_id: int = 0):
        self.rows: dict[str, list] = {
            k: []
            for k in (
                "obs",
                "action",
                "reward",
                "cost",
                "next_obs",
                "terminated",
                "truncated",
                "episode_id",
                "step",
            )
        }
        self.policy_hashes: list[str] = []
        self.episode_id = first_episode_id
        self.t = 0

    def __len__(self) -> int:
        return len(self.rows["reward"])

    def add(
        self, obs, action, reward, cost, next_obs, terminated: bool, truncated: bool, policy: str = ""
    ) -> None:
        r = self.rows
        r["obs"].append(np.asarray(obs, np.float32))
        r["action"].append(np.asarray(action, np.float32))
        r["reward"].append(float(reward))
        r["cost"].append(float(cost))
        r["next_obs"].append(np.asarray(next_obs, np.float32))
        r["terminated"].append(bool(terminated))
        r["truncated"].append(bool(truncated))
        r["episode_id"].append(self.episode_id)
        r["step"].append(self.t)
        self.policy_hashes.append(policy)
        self.t += 1
        if terminated or truncated:
            self.episode_id += 1
            self.t = 0

    def to_transitions(self, env_version: str, random_seed: int, policy: str | None = None) -> Transitions:
        """Stack the rows; ``policy`` overrides the per-row policy hashes with one value."""
        n = len(self)
        r = self.rows
        meta = with_metadata(
            n, env_version=env_version, policy_hash=policy or "0" * 64, random_seed=random_seed
        )
        if policy is None:
            meta["policy_hash"] = np.asarray(self.policy_hashes, dtype=object)
        return Transitions(
            obs=np.stack(r["obs"]),
            action=np.stack(r["action"]),
            reward=np.asarray(r["reward"], np.float32),
            cost=np.asarray(r["cost"], np.float32),
            next_obs=np.stack(r["next_obs"]),
            terminated=np.asarray(r["terminated"], bool),
            truncated=np.asarray(r["truncated"], bool),
            episode_id=np.asarray(r["episode_id"], np.int64),
            step=np.asarray(r["step"], np.int32),
            **meta,
        )


def rollout(
    act: Callable[[np.ndarray], np.ndarray],
    spec: TaskSpec,
    n_transitions: int,
    seed: int,
    policy: str,
    progress: bool = True,
    desc: str = "collect",
) -> Transitions:
    """Collect ``n_transitions`` steps (whole episodes, the last one cut at the limit, marked truncated)."""
    env = make_env(spec)
    env.action_space.seed(seed)
    rec = TransitionRecorder()
    obs, _ = env.reset(seed=seed)
    with tqdm(total=n_transitions, desc=desc, disable=not progress, unit="step") as bar:
        while len(rec) < n_transitions:
            a = act(obs)
            next_obs, r, term, trunc, info = env.step(a)
            last = len(rec) + 1 == n_transitions
            rec.add(obs, a, r, info["cost"], next_obs, term, trunc or last)
            obs = env.reset()[0] if (term or trunc) else next_obs
            bar.update(1)
    env.close()
    return rec.to_transitions(spec.env_version, seed, policy=policy)
