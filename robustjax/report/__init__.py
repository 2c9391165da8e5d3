"""Reports: the versioned ``report.json``, reading one back, and readable summary tables."""

from robustjax.report.summary import (
    TABLES,
    attack_table,
    finished_sections,
    metrics_table,
    natural_shift_table,
    noise_table,
    sanity_table,
)
from robustjax.report.writer import read_report, schema, write_report

__all__ = ["TABLES", "attack_table", "finished_sections", "metrics_table", "natural_shift_table", "noise_table",
           "read_report", "sanity_table", "schema", "write_report"]
