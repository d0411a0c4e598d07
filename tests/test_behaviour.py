"""The behaviour run resumes from its checkpoint after an interruption."""

import json

import numpy as np
import pytest

from arl_models.data.behaviour import RESUME, behaviour_config, train_behaviour
from arl_models.data.dataset import read_dataset
from arl_models.envs.registry import get_task


def test_an_interrupted_behaviour_run_resumes_where_its_checkpoint_left_it(tmp_path):
    spec, bdir = get_task("safe-pendulum"), tmp_path / "behaviour"
    cfg = behaviour_config("safe-pendulum", steps=2_000)
    assert train_behaviour(spec, bdir, cfg, progress=False, stop_after=1_750) is None
    assert (bdir / RESUME).is_dir() and not (bdir / "behaviour.json").exists()

    with pytest.raises(ValueError, match="other settings"):
        train_behaviour(spec, bdir, behaviour_config("safe-pendulum", steps=3_000), progress=False)

    assert train_behaviour(spec, bdir, cfg, progress=False) == bdir
    assert not (bdir / RESUME).exists()
    refs = json.loads((bdir / "behaviour.json").read_text())
    assert [p["step"] for p in refs["curve"]] == [1_500, 2_000]  # the snapshot before the cut is kept
    rows, _ = read_dataset(bdir / "replay")
    assert len(rows) == 2_000
    assert rows.truncated[1_749] and not rows.terminated[1_749]  # the episode the interruption cut
    assert rows.step[1_750] == 0 and rows.episode_id[1_750] == rows.episode_id[1_749] + 1
    assert np.all(np.diff(rows.episode_id) >= 0)
    # rows after the first snapshot were acted by it, on both sides of the interruption
    acted = set(rows.policy_hash[1_500:2_000])
    assert len(acted) == 1 and acted != set(rows.policy_hash[:1_000])
