"""Flow parameters as pydantic models: the Prefect UI renders each as a form, ``prefect.yaml`` fills them.

Each flow takes several top-level models (not one big one) so that a trigger can replace one of them
(``dataset``) while the deployment's defaults keep the others.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from tasks.data import check_dataset_path
from tasks.registry import GATE
from tasks.stages import StageSpec, bc_spec, ewc_spec, finetune_spec, offline_spec


class DatasetRef(BaseModel):
    """Which dataset version to train on."""

    path: str = Field(
        "safe-pendulum-medium-replay", description="Dataset directory inside the data repository."
    )
    version: str | None = Field(
        None,
        description="DVC hash (`<md5>.dir`) or git rev of the data repo; "
        "empty: the latest committed version.",
    )
    repo: str | None = Field(
        None, description="Data repository (git + DVC); empty: ARL_DATA_REPO or .arl/data."
    )

    _safe_path = field_validator("path")(check_dataset_path)


class TrainingConfig(BaseModel):
    """How to train: the library's preset, the seed and optional step overrides."""

    preset: Literal["demo", "paper"] = Field(
        "demo", description="demo: minutes on 2 cores; paper: d3rlpy/CORL sizes."
    )
    seed: int = Field(0, ge=0, lt=2**32, description="Random seed of every stage.")
    bc_steps: int | None = Field(None, gt=0, description="BC gradient steps (empty: the preset's).")
    offline_algo: Literal["cql", "td3bc", "iql", "rebrac"] | None = Field(
        None, description="Stage 2's offline algorithm (empty: the preset's for the dataset's task)."
    )
    offline_steps: int | None = Field(
        None, gt=0, description="Stage 2's gradient steps (empty: the preset's)."
    )
    eval_episodes: int | None = Field(
        None, ge=0, description="Evaluation episodes during training (empty: the preset's)."
    )
    threads: int | None = Field(
        None, gt=0, description="torch threads of each stage's learner (empty: the preset's)."
    )
    constrained: bool = Field(
        True, description="Hold stage 2's actor to the dataset's cost budget (Lagrangian)."
    )
    finetune_steps: int | None = Field(
        None,
        ge=0,
        description="Environment steps of constrained online fine-tuning (empty: the preset's; 0 skips it).",
    )
    finetune_envs: int | None = Field(
        None, gt=0, description="Parallel environments during fine-tuning (empty: the library's)."
    )
    finetune_budget: float | None = Field(
        None,
        gt=0,
        description="Episode cost budget fine-tuning holds to and keeps its best policy within "
        "(empty: the task's).",
    )
    finetune_vector: Literal["sync", "async"] | None = Field(
        None,
        description="sync: environments in the learner's process; async: one worker process each "
        "(empty: the library's).",
    )
    continual_steps: int | None = Field(
        None,
        ge=0,
        description=(
            "EWC gradient steps continuing the champion on a new data version (stage 4, runs only when the "
            "champion learned other versions; empty: the preset's; 0 skips it)."
        ),
    )
    ewc_weight: float | None = Field(
        None,
        ge=0,
        description="Weight of the EWC penalty protecting earlier versions (empty: the library's).",
    )
    rehearsal: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="Share of each EWC-stage batch drawn from the earlier versions' datasets "
        "(empty: the library's; 0: the new data alone).",
    )

    def stage_specs(self, task: str, forgetting_episodes: int) -> dict[str, StageSpec]:
        """The four stages' library configs on ``task``, resolved once from this form (stage 4's forgetting
        is measured over the gate's ``forgetting_episodes``)."""
        common = {
            "preset": self.preset,
            "seed": self.seed,
            "eval_episodes": self.eval_episodes,
            "threads": self.threads,
        }
        online = finetune_spec(
            steps=self.finetune_steps,
            num_envs=self.finetune_envs,
            vector=self.finetune_vector,
            cost_budget=self.finetune_budget,
            **common,
        )
        return {
            "bc": bc_spec(steps=self.bc_steps, **common),
            "offline": offline_spec(
                task=task,
                algo=self.offline_algo,
                steps=self.offline_steps,
                constrained=self.constrained,
                **common,
            ),
            "finetune": online,
            "ewc": ewc_spec(
                online,
                forgetting_episodes,
                self.continual_steps,
                weight=self.ewc_weight,
                rehearsal=self.rehearsal,
            ),
        }


class GateConfig(BaseModel):
    """The promotion gate: when the new policy becomes `champion`."""

    model_name: str | None = Field(None, description="Registered model (empty: arl-<task>).")
    eval_episodes: int = Field(
        GATE.eval_episodes, gt=0, description="Episodes of the final evaluation, from fixed starts."
    )
    eval_seed: int = Field(GATE.eval_seed, ge=0, description="Seed of the final evaluation's starts.")
    tolerance: float = Field(
        GATE.tolerance,
        ge=0,
        description="How far (normalised score points) the new policy may trail the champion.",
    )
    cost_budget: float | None = Field(
        None, ge=0, description="Mean episode cost allowed (empty: the task's budget)."
    )
    max_forgetting: float = Field(
        GATE.max_forgetting,
        ge=0,
        description="Score the policy may lose on earlier data versions (EWC stage).",
    )


class IngestSource(BaseModel):
    """Where a new dataset comes from."""

    kind: Literal["generate", "import"] = Field(
        "generate", description="Generate with the behaviour SAC, or import a file."
    )
    task: str = Field("safe-pendulum", description="Task name, optionally with a version: safe-hopper@1.1.0.")
    quality: str = Field(
        "medium-replay", description="random | medium | expert | medium-replay | medium-expert | imported"
    )
    transitions: int | None = Field(
        None,
        gt=0,
        description="Transitions to collect (empty: the library's; medium-replay takes the replay as it is).",
    )
    seed: int = Field(0, ge=0, lt=2**32)
    behaviour_steps: int | None = Field(
        None, gt=0, description="Steps of the behaviour SAC (empty: the task's)."
    )
    cost_penalty: float | None = Field(
        None,
        ge=0,
        description="k: the behaviour SAC learns reward - k * cost, so the data hold safe episodes "
        "(empty: the library's, none).",
    )
    source: str | None = Field(
        None, description="import: a Minari directory, a D4RL .hdf5 file or a dataset directory."
    )
    format: Literal["minari", "d4rl", "arl"] | None = Field(
        None, description="import format (empty: guessed)."
    )
    name: str | None = Field(None, description="Dataset name in the data repo (empty: <task>-<quality>).")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str | None) -> str | None:
        return None if name is None else check_dataset_path(name)

    def dataset_name(self) -> str:
        if self.name:
            return self.name
        penalty = f"-penalty{self.cost_penalty:g}" if self.kind == "generate" and self.cost_penalty else ""
        return f"{self.task.replace('@', '-')}-{self.quality}{penalty}"

    def import_format(self) -> str:
        if self.format:
            return self.format
        from pathlib import Path

        src = Path(self.source or "")
        if src.is_dir():
            return "arl" if (src / "dataset.json").is_file() else "minari"
        return "d4rl"


# Defaults of the flows' parameters (module-level, so a flow signature holds no call).
DEFAULT_DATASET = DatasetRef()
DEFAULT_TRAINING = TrainingConfig()
DEFAULT_GATE = GateConfig()
DEFAULT_SOURCE = IngestSource()
