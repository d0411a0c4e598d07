"""Evaluation noise: one checkpoint, the same 20-episode evaluation under ten seeds (12345-12354).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/results/2026-12-05/eval_noise.py CHECKPOINT DATASET

``DATASET`` names the version (and its reference returns for the normalised score).
"""

import sys

import numpy as np
import torch

from arl_models.checkpoint import load_policy
from arl_models.data.dataset import read_dataset
from arl_models.envs.registry import get_task
from arl_models.evaluate import evaluate

torch.set_num_threads(1)
ckpt, data = sys.argv[1], sys.argv[2]
info = read_dataset(data)[1]
policy = load_policy(ckpt)
spec = get_task(info.task, info.env_version)
scores = [info.normalized_score(evaluate(policy.act, spec, 20, seed=seed).mean_return) for seed in range(12345, 12355)]
print(ckpt, info.env_version, " ".join(f"{v:.1f}" for v in scores), f"mean {np.mean(scores):.1f} sd {np.std(scores, ddof=1):.1f}")
