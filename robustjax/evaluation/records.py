"""A network's ``robustjax evaluate`` records as the outcomes of the plan's population items.

``evaluate`` keeps, per item it runs, the per-example records the population items record
(``evaluation.items``): the clean pass's correctness, each attack entry's correctness under
attack per epsilon, each corruption's per severity, each perturbation's flip rate and top-5
distance per sequence, the system noise's correctness per variant. A sweep whose plan evaluates every network alone anyway (its
``report`` item: the metrics, natural shift, the checks) reads those items' outcomes from
that one evaluation instead of running them a second time in a population. The outcome is
the population item's own: an example counts as robust to an attack only when it is also
classified correctly clean (``items.ItemRunner``), and the keys of both are the plan's.
"""

from __future__ import annotations

import numpy as np

from robustjax.evaluation.items import Item
from robustjax.evaluation.plan import Plan
from robustjax.evaluation.resume import ItemStore, MemoryStore, scoped
from robustjax.evaluation.runner import corruption_scope, item_names, sequence_scope


def outcome(plan: Plan, items: list[Item], item: Item, records: ItemStore | MemoryStore) -> np.ndarray | None:
    """``item``'s (figures, examples) outcome from ``records`` (one network's evaluation of
    ``plan``, whose items ``items`` is: ``items.expand(plan)``), or None when the records do
    not hold it (an item that failed, or a record of an older version without the arrays)."""
    names = item_names(plan)
    clean = records.load(names["clean"])
    if clean is None:
        return None
    clean_correct = clean.arrays["correct"]
    if item.kind == "clean":
        return clean_correct[None]
    if item.kind == "attack":
        position = [i for i in items if i.kind == "attack"].index(item)
        record = records.load(names[f"attack-{position}"])
        return None if record is None else clean_correct[None] & record.arrays["correct"]
    if item.kind == "corruption":
        s = item.settings
        record = scoped(records, corruption_scope(plan)).load(f"corruption-{s['index']}-{s['name']}")
        if record is None:
            return None
        return record.arrays["correct"][list(plan.corruptions.severities).index(s["severity"])][None]
    if item.kind == "sequence":
        s = item.settings
        record = scoped(records, sequence_scope(plan)).load(f"sequence-{s['index']}-{s['name']}")
        if record is None or "flip_rate" not in record.arrays:  # stored by an older version
            return None
        return np.stack([record.arrays["flip_rate"], record.arrays["top5_distance"]])
    if item.kind == "system_noise":
        record = records.load(names["system_noise"])
        if record is None or "correct" not in record.arrays:  # stored by an older version
            return None
        variants = [(v.decoder, v.resize) for v in plan.system_noise.variants()]
        return record.arrays["correct"][variants.index((item.settings["decoder"], item.settings["resize"]))][None]
    return None
