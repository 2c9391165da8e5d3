"""A network's ``robustjax evaluate`` records as the outcomes of the plan's population items.

``evaluate`` runs every clean, attack, corruption, sequence and system-noise item through
the executor that runs a sweep's populations (``items.ItemRunner``) and keeps each item's
records under ``items.record_name``, named by the item's key. A sweep whose plan evaluates
every network alone anyway (its ``report`` item: the metrics, natural shift, the checks)
reads those items' outcomes from that one evaluation instead of running them a second
time in a population.
"""

from __future__ import annotations

import numpy as np

from robustjax.evaluation.items import Item, record_name
from robustjax.evaluation.plan import Plan
from robustjax.evaluation.resume import ItemStore, MemoryStore


def outcome(plan: Plan, item: Item, records: ItemStore | MemoryStore) -> np.ndarray | None:
    """``item``'s (figures, examples) outcome from ``records`` (one network's evaluation of
    ``plan``), or None when the records do not hold it (an item that failed)."""
    record = records.load(record_name(plan, item))
    return None if record is None else record.arrays["outcome"]
