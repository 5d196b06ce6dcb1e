"""Collecting the cost data (stage collect, and the experiments that measure plans again): the plans to measure,
measuring a chunk of them, the journal of measured chunks (dreamshard.evaluation.collect). A module of its own:
the stage that measures depends on this, not on the rest of the evaluation (project.evaluation)."""
from __future__ import annotations

from dreamshard.evaluation.collect import CostJournal, PlanToMeasure, measure_chunk, pending_chunks, plans_to_measure
from dreamshard.hardware.comm import MODEL_VERSION as COMM_MODEL_VERSION

__all__ = ["COMM_MODEL_VERSION", "CostJournal", "PlanToMeasure", "measure_chunk", "pending_chunks", "plans_to_measure"]
