"""arl_models: the RL library of the arl training system.

Datasets and replay, tasks with a safety cost, networks, BC, CQL, SAC (and the online stages built on
it), evaluation and checkpoints. Pure torch / numpy / gymnasium / pyarrow: it never imports the
orchestration layers (prefect, mlflow, great_expectations, dvc, boto3).
"""

__version__ = "0.1.0"
