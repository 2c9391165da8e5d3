"""Export at scale: a sweep's table reads the per-example outcomes one network at a time, so
its memory holds the figures and not the outcomes (benchmarks.export_memory measures the
15,625-network case)."""

import tracemalloc

from benchmarks.export_memory import synthetic_store
from robustjax.sweep import export
from robustjax.sweep.store import Store

NETWORKS, EXAMPLES = 2000, 512  # unpacked at once, their outcomes would take 2000 x 100 x 512 B = 98 MiB


def test_export_memory_holds_the_figures_not_the_outcomes(tmp_path):
    synthetic_store(tmp_path / "s.sqlite", NETWORKS, EXAMPLES)
    store = Store.read(tmp_path / "s.sqlite")
    tracemalloc.start()
    try:
        table = export.table(store)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(table.rows) == NETWORKS and len(table.figures) == 100 + 10  # and a worst case per epsilon
    assert 0.3 < table.rows[-1]["a3 eps=0.05"] < 0.7 and table.rows[0]["worst linf eps=0.1"] < 0.01
    assert peak < 48 * 2**20, f"export peaked at {peak / 2**20:.0f} MiB"
