"""Flow parameters as pydantic models: the Prefect UI renders each as a form, ``prefect.yaml`` fills them.

Each flow takes several top-level models (not one big one) so that a trigger can replace one of them
(``dataset``) while the deployment's defaults keep the others.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from tasks.data import check_dataset_path


class DatasetRef(BaseModel):
    """Which dataset version to train on."""

    path: str = Field(
        "safe-pendulum-medium-replay", description="Dataset directory inside the data repository."
    )
    version: str | None = Field(
        None,
        description="DVC hash (`<md5>.dir`) or git rev of the data repo; empty: the latest committed version.",
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
    offline_algo: Literal["cql", "td3bc", "iql"] | None = Field(
        None, description="Stage 2's offline algorithm (empty: the preset's)."
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
    finetune_envs: int = Field(4, gt=0, description="Parallel environments during fine-tuning.")
    finetune_budget: float | None = Field(
        None,
        gt=0,
        description="Episode cost budget fine-tuning holds to and keeps its best policy within (empty: the task's).",
    )
    finetune_vector: Literal["sync", "async"] = Field(
        "sync", description="sync: environments in the flow's process; async: one worker process each."
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
        description="Weight of the EWC penalty protecting earlier versions (empty: the library's, 100).",
    )
    rehearsal: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of each EWC-stage batch drawn from the earlier versions' datasets (0: the new data alone).",
    )

    def stage_settings(self, stage: str) -> dict:
        steps = {
            "bc": self.bc_steps,
            "offline": self.offline_steps,
            "finetune": self.finetune_steps,
            "ewc": self.continual_steps,
        }[stage]
        settings = {
            "preset": self.preset,
            "seed": self.seed,
            "steps": steps,
            "eval_episodes": self.eval_episodes,
            "constrained": self.constrained,
            "threads": self.threads,
        }
        if stage == "offline":
            settings["offline_algo"] = self.offline_algo
        if stage in ("finetune", "ewc"):
            settings |= {"num_envs": self.finetune_envs, "vector": self.finetune_vector}
            if self.finetune_budget is not None:
                settings["cost_budget"] = self.finetune_budget
        if stage == "ewc":
            settings |= {
                "ewc_weight": self.ewc_weight,
                "rehearsal": self.rehearsal,
                "online_steps": self.finetune_steps,
            }
        return settings


class GateConfig(BaseModel):
    """The promotion gate: when the new policy becomes `champion`."""

    model_name: str | None = Field(None, description="Registered model (empty: arl-<task>).")
    eval_episodes: int = Field(
        50,
        gt=0,
        description="Episodes of the final evaluation (its start states decide a mean cost: one safe-pendulum "
        "policy paid 12.4 and 6.6 on two sets of 10 starts, 10.3 and 8.0 on two sets of 50).",
    )
    eval_seed: int = Field(12345, ge=0, description="Seed of the final evaluation.")
    tolerance: float = Field(
        5.0, ge=0, description="How far (normalised score points) the new policy may trail the champion."
    )
    cost_budget: float | None = Field(
        None, ge=0, description="Mean episode cost allowed (empty: the task's budget)."
    )
    max_forgetting: float = Field(
        10.0, ge=0, description="Score the policy may lose on earlier data versions (EWC stage)."
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
    transitions: int = Field(
        100_000, gt=0, description="Transitions to collect (medium-replay takes the replay as it is)."
    )
    seed: int = Field(0, ge=0, lt=2**32)
    behaviour_steps: int | None = Field(
        None, gt=0, description="Steps of the behaviour SAC (empty: the task's)."
    )
    cost_penalty: float = Field(
        0.0,
        ge=0,
        description="k: the behaviour SAC learns reward - k * cost, so the data hold safe episodes.",
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
