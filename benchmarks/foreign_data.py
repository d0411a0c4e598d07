"""Datasets the project did not make: behaviour policies trained by stable-baselines3, logged the D4RL way.

A SAC of stable-baselines3 (not the project's SAC) is trained on the plain gymnasium environment, cached
under ``--cache`` (its own ``.zip``, made here), then rolled out with Gaussian action noise and clipping
to the bounds, as logged control data usually is: a share of the action entries sits exactly at ±1.
The rollout is written as a D4RL-style HDF5 file (``observations, actions, rewards, terminals, timeouts,
next_observations``), which ``arl data import`` reads like any user's file. The reference returns of the
task (random and expert) are not known to such a file; the data's own return is printed and stored in
the file's attributes.

Runs in ``.venv-bench`` (stable-baselines3 is a benchmark dependency, never a runtime one)::

    .venv-bench/bin/python benchmarks/foreign_data.py --env Hopper-v5 --train-steps 125000 \
        --transitions 100000 --noise 0.1 --out data/foreign/hopper-sb3.hdf5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import torch


def behaviour(env_id: str, steps: int, seed: int, cache: Path, replay_out: Path | None):
    """An SB3 SAC trained ``steps`` environment steps on ``env_id``, cached by its settings. With
    ``replay_out`` the training run's replay (every transition it saw: D4RL's medium-replay) is written
    there too, which needs the run itself, not its cache."""
    from stable_baselines3 import SAC

    path = cache / f"sb3-sac-{env_id}-{steps}-s{seed}.zip"
    if path.is_file() and replay_out is None:
        return SAC.load(path, device="cpu"), None
    t0 = time.perf_counter()
    model = SAC("MlpPolicy", gym.make(env_id), seed=seed, device="cpu", verbose=0, buffer_size=steps)
    model.learn(total_timesteps=steps, progress_bar=False)
    cache.mkdir(parents=True, exist_ok=True)
    model.save(path)
    if replay_out is not None:
        rb = model.replay_buffer
        n = rb.buffer_size if rb.full else rb.pos
        timeouts = rb.timeouts[:n, 0].astype(bool)
        d = {
            "observations": rb.observations[:n, 0],
            "actions": rb.actions[:n, 0],
            "rewards": rb.rewards[:n, 0],
            "terminals": rb.dones[:n, 0].astype(bool) & ~timeouts,
            "timeouts": timeouts,
            "next_observations": rb.next_observations[:n, 0],
        }
        d["timeouts"][-1] = not d["terminals"][-1]
        write_hdf5(
            replay_out,
            d,
            summarise(d)
            | {
                "env": env_id,
                "behaviour": "stable-baselines3 SAC replay",
                "train_steps": steps,
                "seed": seed,
            },
        )
    return model, time.perf_counter() - t0


def rollout(model, env_id: str, transitions: int, noise: float, seed: int) -> dict[str, np.ndarray]:
    """``transitions`` steps of the behaviour's deterministic action plus N(0, noise), clipped to the
    bounds."""
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    low, high = env.action_space.low, env.action_space.high
    keys = ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations")
    out: dict[str, list] = {k: [] for k in keys}
    obs, _ = env.reset(seed=seed)
    for _ in range(transitions):
        act, _ = model.predict(obs, deterministic=True)
        act = np.clip(act + noise * rng.standard_normal(act.shape) * (high - low) / 2, low, high)
        nxt, rew, term, trunc, _ = env.step(act)
        for k, v in zip(keys, (obs, act, rew, term, trunc, nxt), strict=True):
            out[k].append(v)
        obs = nxt
        if term or trunc:
            obs, _ = env.reset()
    out["timeouts"][-1] = not out["terminals"][-1]  # the file ends an episode: cut at its last step
    return {
        k: np.asarray(v, np.float32 if k not in ("terminals", "timeouts") else bool) for k, v in out.items()
    }


def summarise(d: dict[str, np.ndarray]) -> dict:
    ends = d["terminals"] | d["timeouts"]
    returns = np.bincount(np.r_[0, np.cumsum(ends)[:-1]], weights=d["rewards"])
    return {
        "transitions": len(ends),
        "episodes": int(ends.sum()),
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "saturated_share": float((np.abs(d["actions"]) >= 1.0).mean()),
    }


def write_hdf5(out: Path, d: dict[str, np.ndarray], summary: dict) -> None:
    """Write ``d`` as a D4RL-style file, atomically; ``summary`` goes into its attributes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with h5py.File(tmp, "w") as f:
        for k, v in d.items():
            f.create_dataset(k, data=v, compression="gzip")
        f.attrs["summary"] = json.dumps(summary)
    tmp.replace(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="Hopper-v5")
    p.add_argument("--train-steps", type=int, default=125_000)
    p.add_argument("--transitions", type=int, default=100_000)
    p.add_argument(
        "--noise", type=float, default=0.1, help="Gaussian noise std, as a share of half the action range"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "arl" / "sb3")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--replay-out", type=Path, help="Also write the behaviour's training replay (medium-replay)"
    )
    a = p.parse_args()
    torch.set_num_threads(1)
    model, train_s = behaviour(a.env, a.train_steps, a.seed, a.cache, a.replay_out)
    d = rollout(model, a.env, a.transitions, a.noise, a.seed + 1)
    summary = summarise(d) | {
        "env": a.env,
        "behaviour": "stable-baselines3 SAC",
        "train_steps": a.train_steps,
        "seed": a.seed,
        "noise": a.noise,
        "behaviour_train_s": train_s,
    }
    write_hdf5(a.out, d, summary)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
