"""Prefect flows: the pipelines, composed from the tasks in ``tasks/``; no algorithm code lives here."""
