"""A network's evaluate records give each population item's outcome: the same per-example
values the population runner computes for that network, item by item (clean, an attack
with an epsilon grid, each corruption severity, a perturbation sequence, each system-noise
variant); an item the records lack is left to the population."""

import numpy as np

import robustjax as rj
from robustjax.evaluation import evaluate, records
from robustjax.evaluation.items import ItemRunner, expand
from robustjax.evaluation.plan import plan_from_dict
from robustjax.evaluation.resume import MemoryStore
from robustjax.nas.population import Population

PLAN = plan_from_dict({
    "batch_size": 32, "num_examples": 64, "seed": 3,
    "attacks": [{"name": "fgsm", "eps": 1.0}, {"name": "pgd", "eps": [0.05, 0.2], "steps": 2}],
    "corruptions": {"names": ["gaussian_noise", "brightness"], "severities": [2, 5]},
    "sequences": {"names": ["translate"], "batch_size": 8},
    "system_noise": {"decoders": ["pil"], "resizes": ["pil-bilinear", "pil-nearest"]}})


def test_evaluate_records_give_the_population_items_outcomes():
    # random weights: most examples are misclassified clean, and FGSM's step of 1 moves one of
    # those onto its true class, which must not count as robust
    model, dataset = rj.zoo.create("digits_cnn", pretrained=False), rj.data.digits("test")
    stored = MemoryStore()
    evaluate(model, dataset, PLAN, store=stored)
    population = Population.stack([model])
    runner = ItemRunner(dataset, PLAN)
    items = expand(PLAN)
    kinds = set()
    for item in items:
        derived = records.outcome(PLAN, items, item, stored)
        expected = runner.run(item, population.classifier, population.axes)[0]
        assert derived.shape == expected.shape and derived.dtype == expected.dtype, item.labels
        np.testing.assert_array_equal(derived, expected, err_msg=str(item.labels))
        kinds.add(item.kind)
    assert kinds == {"clean", "attack", "corruption", "sequence", "system_noise"}
    # the records hold examples misclassified clean yet classified correctly once attacked;
    # the outcomes count none of them as robust
    clean = records.outcome(PLAN, items, items[0], stored)[0]
    names = rj.evaluation.runner.item_names(PLAN)
    assert any((stored.load(names[f"attack-{p}"]).arrays["correct"] & ~clean).any() for p in range(len(PLAN.runs)))
    for item in items:
        if item.kind == "attack":
            assert not (records.outcome(PLAN, items, item, stored) & ~clean).any()


def test_an_item_the_records_lack_is_left_to_the_population():
    items = expand(PLAN)
    assert all(records.outcome(PLAN, items, item, MemoryStore()) is None for item in items)
