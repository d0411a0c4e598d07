"""kill -9 of a stage after a checkpoint, then the same command again: the weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from arl_models.checkpoint import TRAIN_STATE, WEIGHTS

ROOT = Path(__file__).resolve().parents[2]
OFFLINE = """
import sys
from arl_models.algos.cql import CQLConfig
from arl_models.offline import train_bc, train_offline_algo
algo, data, out = sys.argv[1:4]
kw = dict(steps=2000, preset="demo", progress=False, eval_episodes=0, seed=3)
if algo == "bc":
    train_bc(data, out, **kw)
else:  # small networks: the demo preset's checkpoint cadence, at a fraction of its step time
    cfg = CQLConfig(hidden=(16, 16), batch_size=32, n_action_samples=2)
    train_offline_algo(algo, data, out, config=cfg, **kw)
"""
FINETUNE = """
import sys
from arl_models.online import FinetuneConfig, finetune
src, data, out = sys.argv[1:4]
cfg = FinetuneConfig(steps=2000, num_envs=2, vector="sync", utd=0.05, eval_episodes=0, batch_size=32)
finetune(src, out, data=data, config=cfg, progress=False)
"""
CONTINUAL = """
import sys
from arl_models.continual import ContinualConfig, train_continual
src, data, previous, out = sys.argv[1:5]
cfg = ContinualConfig(steps=2000, baseline=False, eval_episodes=2)
train_continual(src, data, out, previous=[previous], config=cfg, progress=False)
"""


def _run(script: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True
    )


def _finish(script: str, *args: str) -> None:
    p = _run(script, *args)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]


def _kill_after_first_checkpoint(script: str, *args: str) -> None:
    out = Path(args[-1])
    p = _run(script, *args)
    deadline = time.monotonic() + 300
    while not (out / TRAIN_STATE / "state.json").is_file():
        assert p.poll() is None, p.stderr.read()[-3000:] if p.stderr else p.returncode
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL
    assert not (out / "metrics.json").is_file(), "the run finished before it was killed"


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(str(a / WEIGHTS)), load_file(str(b / WEIGHTS))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    steps = [json.loads(line).get("step") for line in (b / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)), "log lines written twice"


@pytest.mark.parametrize("algo", ["bc", "cql"])
def test_offline_stage_killed_resumes_to_the_same_weights(algo, tiny_dataset, tmp_path):
    _finish(OFFLINE, algo, str(tiny_dataset), str(tmp_path / "whole"))
    _kill_after_first_checkpoint(OFFLINE, algo, str(tiny_dataset), str(tmp_path / "killed"))
    _finish(OFFLINE, algo, str(tiny_dataset), str(tmp_path / "killed"))
    _same_weights(tmp_path / "whole", tmp_path / "killed")


def test_continual_stage_killed_resumes_to_the_same_weights(tiny_cql, pendulum_data, tmp_path):
    from tests.online.conftest import write_pendulum_data

    new = str(write_pendulum_data(tmp_path / "v1.1.0", version="1.1.0", seed=1))
    args = (str(tiny_cql), new, str(pendulum_data))
    _finish(CONTINUAL, *args, str(tmp_path / "whole"))
    _kill_after_first_checkpoint(CONTINUAL, *args, str(tmp_path / "killed"))
    _finish(CONTINUAL, *args, str(tmp_path / "killed"))
    _same_weights(tmp_path / "whole", tmp_path / "killed")


def test_finetune_killed_resumes_to_the_same_weights(tiny_cql, pendulum_data, tmp_path):
    _finish(FINETUNE, str(tiny_cql), str(pendulum_data), str(tmp_path / "whole"))
    _kill_after_first_checkpoint(FINETUNE, str(tiny_cql), str(pendulum_data), str(tmp_path / "killed"))
    _finish(FINETUNE, str(tiny_cql), str(pendulum_data), str(tmp_path / "killed"))
    _same_weights(tmp_path / "whole", tmp_path / "killed")
