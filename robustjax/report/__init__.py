"""Reports: the versioned ``report.json``, reading one back, and readable summary tables."""

from robustjax.report.summary import (
           attack_table,
           metrics_table,
           noise_table,
           ready_tables,
           sanity_table,
)
from robustjax.report.writer import read_report, schema, write_report

__all__ = ["attack_table", "metrics_table", "noise_table", "read_report", "ready_tables", "sanity_table", "schema",
           "write_report"]
