"""Prefect orchestration of the DVC stages. `python -m pipeline STAGE` runs one stage as a flow."""
