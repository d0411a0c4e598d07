"""Two processes at once on one checkpoint folder or one data repository: one writes, the other waits."""

import json
import subprocess
import sys
from pathlib import Path

TRAIN = """
import json, sys
from arl_models.offline import train_bc
r = train_bc(sys.argv[1], sys.argv[2], steps=400, preset="demo", progress=False, eval_episodes=0)
print(json.dumps(r))
"""
INIT = """
import sys
from tasks.versioning import ensure_repo
print(ensure_repo(sys.argv[1]))
"""


def _both(script: str, *args: str) -> list[str]:
    env = {
        "OMP_NUM_THREADS": "1",
        "PATH": "/usr/bin:/bin",
        "HOME": str(Path.home()),
        "GIT_AUTHOR_NAME": "t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@l",
        "GIT_COMMITTER_EMAIL": "t@l",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=Path(__file__).parents[1],
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    return [o.strip().splitlines()[-1] for o, _ in outs]


def test_two_runs_into_one_checkpoint_folder_train_once(tiny_dataset, tmp_path):
    out = tmp_path / "bc"
    first, second = (json.loads(r) for r in _both(TRAIN, str(tiny_dataset), str(out)))
    assert first == second  # the one that waited found the other's finished checkpoint and its record
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 400


def test_two_processes_initialise_one_data_repo(tmp_path):
    repo = tmp_path / "data"
    assert _both(INIT, str(repo)) == [str(repo)] * 2
    log = subprocess.run(
        ["git", "-C", str(repo), "log", "--format=%s"], capture_output=True, text=True, check=True
    )
    assert log.stdout.splitlines() == ["Initialise DVC"]
