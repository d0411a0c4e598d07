"""MLflow "model from code": the pyfunc that serves a policy checkpoint. Nothing is pickled.

MLflow copies this file beside the model and runs it on load; ``set_model`` names the model object.
``load_context`` reads the policy the checkpoint directory hands over (``best/`` of a fine-tuning stage,
else its own weights; safetensors + JSON) through ``arl_models.checkpoint``, which travels with the model
(its ``code/`` directory); ``predict`` maps float32 observations ``(N, obs_dim)`` to float32 actions
``(N, action_dim)`` within the action bounds. The model's signature (:func:`tasks.registry.policy_signature`)
makes MLflow refuse a wrong width or a non-numeric value before ``predict`` runs; ``predict`` itself refuses
non-finite observations. Both refusals reach a scoring server's client as a 400 with a message.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mlflow.exceptions import MlflowException
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel

CHECKPOINT_ARTIFACT = "checkpoint"


def finite_observations(model_input: Any) -> np.ndarray:
    """``model_input`` (an array, a DataFrame or a list of rows) as a float32 array; an observation
    holding NaN or infinity (JSON ``null``, ``"NaN"``) is an invalid-parameter error naming its rows."""
    obs = np.asarray(
        model_input.to_numpy() if hasattr(model_input, "to_numpy") else model_input, dtype=np.float32
    )
    rows = np.flatnonzero(~np.isfinite(np.atleast_2d(obs)).all(axis=-1)).tolist()
    if rows:
        raise MlflowException.invalid_parameter_value(
            f"observations must be finite numbers: row(s) {rows[:10]} hold NaN, infinity or null"
        )
    return obs


class PolicyModel(PythonModel):
    def load_context(self, context: Any) -> None:
        from arl_models.checkpoint import handed_over, load_policy

        self.policy = load_policy(handed_over(context.artifacts[CHECKPOINT_ARTIFACT]))

    # np.ndarray is one of the hints MLflow takes without inferring a schema from it (a list or dataclass
    # hint would become one): the registered signature, a float32 tensor of the policy's observation width,
    # stays the one it enforces, and it hands predict that tensor as an array. Without any hint MLflow warns
    # "Add type hints to the `predict` method" each time this file runs (every registration and load).
    def predict(
        self, context: Any, model_input: np.ndarray, params: dict[str, Any] | None = None
    ) -> np.ndarray:
        deterministic = bool((params or {}).get("deterministic", True))
        actions = self.policy.act(finite_observations(model_input), deterministic=deterministic)
        return np.asarray(actions, dtype=np.float32)


set_model(PolicyModel())
