"""Sweep export where a slip would go unnoticed (issue 36): the per-example worst case of a
plan that mixes threat models and epsilons. (Which network a rerun's row belongs to:
tests/test_sweep.py, beside its finished-sweep fixture.)"""

import numpy as np

from robustjax import nas
from robustjax.evaluation import plan_from_dict
from robustjax.evaluation.items import expand
from robustjax.nas.models import network_card
from robustjax.sweep import export
from robustjax.sweep.store import Store, pack

EXAMPLES = 40


def test_export_worst_case_is_per_threat_model_and_epsilon(tmp_path):
    """Worst case at (norm, eps): an example is robust only if every attack at that norm and
    epsilon failed on it; a column only where two or more attacks share the budget. Linf and
    L2 attacks here share epsilon 0.1, and FGSM's params name no norm (it is Linf)."""
    plan = plan_from_dict({"attacks": [
        {"name": "fgsm", "eps": [0.1, 0.2]},
        {"name": "pgd", "eps": [0.1, 0.3], "steps": 2},
        {"name": "pgd", "eps": [0.1, 0.5], "norm": "l2", "steps": 2},
        {"name": "apgd", "eps": 0.5, "norm": "l2", "steps": 2},
        {"name": "pgd", "eps": 0.5, "norm": "l1", "steps": 2},
    ]})
    items = expand(plan)
    store = Store.open(tmp_path / "s.sqlite", {"data_key": "synthetic", "examples": EXAMPLES})
    store.set_items([(item.key_for(plan), item.kind, item.settings, item.labels) for item in items])
    space = nas.space("nb201")
    configs = [space.config(index) for index in (11472, 0, 9)]
    store.add_networks([(c.arch_id, "32", network_card(space, c)) for c in configs])
    rng = np.random.default_rng(0)
    outcomes = {c.arch_id: {} for c in configs}  # per network, label -> robust per example
    rows = []
    for c in configs:
        for item in items:
            robust = rng.random((len(item.labels), EXAMPLES)) < 0.7
            outcomes[c.arch_id].update(zip(item.labels, robust))
            rows.append({"arch_id": c.arch_id, "item_key": item.key_for(plan), "status": "ok",
                         "figures": {label: float(r.mean()) for label, r in zip(item.labels, robust)},
                         "outcome": pack(robust), "examples": EXAMPLES, "seconds": 1.0, "worker": "test"})
    store.commit(rows)
    budgets = {  # (norm, eps): its attacks' labels, written out from the plan above
        ("linf", 0.1): ["fgsm eps=0.1", "pgd eps=0.1"],
        ("linf", 0.2): ["fgsm eps=0.2"], ("linf", 0.3): ["pgd eps=0.3"],
        ("l2", 0.1): ["pgd eps=0.1 #2"], ("l2", 0.5): ["pgd eps=0.5", "apgd eps=0.5"],
        ("l1", 0.5): ["pgd eps=0.5 #4"],
    }
    assert sorted(label for labels in budgets.values() for label in labels) == sorted(
        label for item in items if item.kind == "attack" for label in item.labels)

    table = export.table(store)
    worst_columns = [name for name in table.figures if name.startswith("worst ")]
    assert sorted(worst_columns) == ["worst l2 eps=0.5", "worst linf eps=0.1"]
    for row in table.rows:
        robust = outcomes[row["arch_id"]]
        for (norm, eps), labels in budgets.items():
            if len(labels) > 1:
                expected = np.logical_and.reduce([robust[label] for label in labels]).mean()
                assert row[f"worst {norm} eps={eps:g}"] == expected, (row["arch_id"], norm, eps)
                assert expected < min(robust[label].mean() for label in labels)  # the worst case binds
        assert row["pgd eps=0.1 #2"] == robust["pgd eps=0.1 #2"].mean()
    store.close()
