"""Reports: the versioned ``report.json`` and a readable summary table."""

from robustjax.report.summary import metrics_table, sanity_table, summary_table
from robustjax.report.writer import schema, write_report

__all__ = ["metrics_table", "sanity_table", "schema", "summary_table", "write_report"]
