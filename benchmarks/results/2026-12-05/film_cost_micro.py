"""Update rate of CQL with and without FiLM conditioning, interleaved in one process (2.x pendulum shapes).

OMP_NUM_THREADS=1 .venv/bin/python benchmarks/results/2026-12-05/film_cost_micro.py
"""

import time

import numpy as np
import torch

from arl_models.algos.cql import CQL, CQLConfig
from arl_models.replay import ReplayBuffer

torch.set_num_threads(1)
rng = np.random.default_rng(0)
buf = ReplayBuffer(10000, 6, 1)
buf.add(
    obs=rng.normal(size=(10000, 6)).astype(np.float32),
    act=rng.uniform(-1, 1, (10000, 1)).astype(np.float32),
    rew=rng.normal(size=10000).astype(np.float32),
    cost=np.zeros(10000, np.float32),
    next_obs=rng.normal(size=(10000, 6)).astype(np.float32),
    done=np.zeros(10000, np.float32),
)
for h in (64, 128):
    algos = {k: CQL(6, 1, CQLConfig(hidden=(h, h), context_dim=k, n_action_samples=4)) for k in (0, 3)}
    t = {0: 0.0, 3: 0.0}
    for r in range(6):  # round 0 warms up; the others alternate plain and FiLM 50 updates at a time
        for k, a in algos.items():
            t0 = time.perf_counter()
            for _ in range(50):
                a.update(buf.sample(256))
            if r > 0:
                t[k] += time.perf_counter() - t0
    print(
        f"hidden {h}: plain {250 / t[0]:.1f} updates/s, FiLM {250 / t[3]:.1f} updates/s, "
        f"ratio {t[3] / t[0]:.2f}x time"
    )
