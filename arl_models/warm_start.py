"""Warm starts: a learner initialised from another stage's checkpoint.

Every stage after the first starts from the one before it, in one of two ways:

* :func:`actor_from`: the actor alone, from a BC checkpoint (stage 2 from stage 1). Whatever of the BC
  actor matches by name and shape is copied (trunk and mean head; the log-std head of a deterministic
  BC actor does not exist, so it keeps its initialisation), through the learner's ``warm_start_actor``.
* :func:`learner_from`: a whole learner, from an offline or fine-tuning checkpoint (stage 3 from stage 2,
  stage 4 from stage 2 or 3). From a checkpoint of the same parts (:data:`SAME_PARTS`) every weight and
  optimiser moment is loaded; from TD3+BC or IQL, whose parts differ, the networks both have (actor,
  critics, cost critics, their targets), while the optimisers and the temperature start fresh. Either way
  the step counter and the multiplier restart at 0: offline the multiplier weighs the cost critic's value
  at the data's episode starts, online the episodes' cost, in other units.

The idea is d3rlpy's ``copy_policy_from`` / ``copy_q_function_from``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from arl_models.algos.sac import SAC
from arl_models.checkpoint import TRAIN_STATE, WEIGHTS, Algorithm, load_train_state, load_weights, read_config
from arl_models.lagrange import PIDLagrangian
from arl_models.nets import ObsNorm

SAME_PARTS = ("cql", "calql", "sac")
"""Algorithms whose checkpoints hold every part of the SAC-family learner, optimisers included."""


def actor_from(algo: Any, init_actor: str | Path) -> dict[str, Any]:
    """Copy a BC checkpoint's actor into ``algo``'s (what matches); returns what the record keeps of it
    (``init_actor``: path, algorithm, keys copied). The conditioning must match."""
    bc_record = read_config(init_actor)
    bc_context = bc_record["config"].get("context_dim", 0)
    if bc_context != algo.cfg.context_dim:
        raise ValueError(
            f"{init_actor}: its actor is conditioned on {bc_context} context entries and this {algo.name} "
            f"on {algo.cfg.context_dim}; train both with the same context_dim"
        )
    weights = load_file(str(Path(init_actor) / WEIGHTS))
    actor = {k[6:]: v for k, v in weights.items() if k.startswith("actor.")}
    # an actor from before input statistics was trained on raw inputs: it keeps the identity's
    identity = {f"obs_norm.{k}": v for k, v in ObsNorm(algo.obs_dim).state_dict().items()}
    copied = algo.warm_start_actor(identity | actor)
    if all(k.startswith("obs_norm.") for k in copied):  # the statistics alone always fit
        raise ValueError(f"{init_actor}: no actor weights match {algo.name}'s actor (hidden sizes differ?)")
    return {"path": str(init_actor), "algo": bc_record["algo"], "keys": len(copied)}


def learner_from(algo: SAC, from_dir: str | Path) -> dict[str, float]:
    """Load the checkpoint in ``from_dir`` into ``algo`` (all of it from :data:`SAME_PARTS`, else the
    shared networks) and restart its step count and its multiplier, which keeps ``algo``'s gains: each
    stage's multiplier measures its own signal. Returns the multiplier state the checkpoint ended with, for
    the record. Loading the train state also sets torch's RNG to the checkpoint's."""
    if read_config(from_dir)["algo"] in SAME_PARTS:
        load_train_state(from_dir, algo)
    else:
        shared_networks_from(algo, from_dir)
    previous = algo.lagrangian.state()
    algo.lagrangian = PIDLagrangian(algo.lagrangian.cfg)
    algo.step = 0
    return previous


def shared_networks_from(algo: Algorithm, from_dir: str | Path) -> list[str]:
    """Load into ``algo`` every network of the checkpoint in ``from_dir`` that ``algo`` has too, whole (a
    network that does not fit is an error), and the multiplier's state from its ``train_state/``; returns
    the networks loaded. For a learner of another algorithm than the checkpoint's."""
    where = Path(from_dir)
    tensors = load_file(str(where / TRAIN_STATE / "state.safetensors"))
    prefixes = {k.split(".", 1)[0] for k in tensors if not k.startswith(("opt.", "rng.", "param."))}
    loaded = [name for name in algo.networks() if name in prefixes]
    for name in loaded:
        load_weights(algo.networks()[name], tensors, f"{name}.", where)
    extra = json.loads((where / TRAIN_STATE / "state.json").read_text())["extra"]
    algo.load_extra_state(
        {**algo.extra_state(), **{k: v for k, v in extra.items() if k.startswith("lagrangian.")}}
    )
    return loaded
