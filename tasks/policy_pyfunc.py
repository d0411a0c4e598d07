"""MLflow "model from code": the pyfunc that serves a policy checkpoint. Nothing is pickled.

MLflow copies this file beside the model and runs it on load; ``set_model`` names the model object.
``load_context`` reads the policy the checkpoint directory hands over (``best/`` of a fine-tuning stage,
else its own weights; safetensors + JSON) through ``arl_models.checkpoint``; ``predict`` maps
observations ``(N, obs_dim)`` to actions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel

CHECKPOINT_ARTIFACT = "checkpoint"


class PolicyModel(PythonModel):
    def load_context(self, context: Any) -> None:
        from arl_models.checkpoint import handed_over, load_policy

        self.policy = load_policy(handed_over(context.artifacts[CHECKPOINT_ARTIFACT]))

    # model_input is left unannotated: MLflow would turn a type hint into a schema (a 2-D float array,
    # a DataFrame or a list of rows are all accepted here).
    def predict(self, context: Any, model_input, params: dict[str, Any] | None = None) -> np.ndarray:
        obs = model_input.to_numpy() if hasattr(model_input, "to_numpy") else model_input
        deterministic = bool((params or {}).get("deterministic", True))
        return np.asarray(self.policy.act(np.asarray(obs, dtype=np.float32), deterministic=deterministic))


set_model(PolicyModel())
