"""Evaluation noise: one checkpoint, the same 20-episode evaluation under ten seeds (12345-12354).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/results/2026-12-05/eval_noise.py CHECKPOINT DATASET

``DATASET`` names the version (and its reference returns for the normalised score).
"""

import sys

import numpy as np
import torch

from arl_models.continual import score_on
from arl_models.data.dataset import read_dataset

torch.set_num_threads(1)
ckpt, data = sys.argv[1], sys.argv[2]
info = read_dataset(data)[1]
scores = [score_on(ckpt, info, 20, seed=seed) for seed in range(12345, 12355)]
print(
    ckpt,
    info.env_version,
    " ".join(f"{v:.1f}" for v in scores),
    f"mean {np.mean(scores):.1f} sd {np.std(scores, ddof=1):.1f}",
)
