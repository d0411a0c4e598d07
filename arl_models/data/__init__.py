"""The data layer: the Parquet dataset format, importers and dataset generation."""

from arl_models.data.dataset import (
    COLUMNS,
    DatasetError,
    DatasetInfo,
    Transitions,
    read_dataset,
    read_info,
    with_metadata,
    write_dataset,
)

__all__ = [
    "COLUMNS",
    "DatasetError",
    "DatasetInfo",
    "Transitions",
    "read_dataset",
    "read_info",
    "with_metadata",
    "write_dataset",
]
