"""The data users give, for the stages, benchmarks, experiments and tools: the DLRM format and its synthetic
generator, request files, lookups, access-count bins, the production model's tables (dreamshard.data)."""
from __future__ import annotations

from dreamshard.data.bins import META_KEY, fit_tables_file
from dreamshard.data.dlrm import (
    MANIFEST,
    SyntheticConfig,
    TableProfile,
    generate_lookups,
    generate_synthetic,
    is_dataset_file,
    load_dlrm_file,
    sample_table_profiles,
    save_dlrm_file,
    synthetic_pooling,
    table_seed,
    table_statistics,
)
from dreamshard.data.examples import production_model_tables
from dreamshard.data.lookups import DEFAULT_ZIPF_ALPHA, GeneratedLookups, RecordedLookups
from dreamshard.data.requests import TableRequests, requests_to_arrow

__all__ = [
    "DEFAULT_ZIPF_ALPHA", "MANIFEST", "META_KEY", "GeneratedLookups", "RecordedLookups", "SyntheticConfig",
    "TableProfile", "TableRequests", "fit_tables_file", "generate_lookups", "generate_synthetic", "is_dataset_file",
    "load_dlrm_file", "production_model_tables", "requests_to_arrow", "sample_table_profiles", "save_dlrm_file",
    "synthetic_pooling", "table_seed", "table_statistics",
]
