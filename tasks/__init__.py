"""Prefect tasks: thin wiring between the arl_models library and MLflow, Great Expectations and DVC.

Importing this package is cheap: each module imports Great Expectations and MLflow lazily, inside the
functions that need them.
"""
