"""A network's evaluate records give each population item's outcome: the same per-example
values the population runner computes for that network, item by item (clean, an attack
with an epsilon grid, each corruption severity, a perturbation sequence, each system-noise
variant); an item the records lack is left to the population."""

import jax
import numpy as np

import robustjax as rj
from robustjax.evaluation import evaluate, items, records
from robustjax.evaluation.items import ItemRunner, expand, record_name
from robustjax.evaluation.plan import plan_from_dict
from robustjax.evaluation.population import evaluate_population_batch
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
        derived = records.outcome(PLAN, item, stored)
        expected = runner.run(item, population.classifier, population.axes)[0]
        assert derived.shape == expected.shape and derived.dtype == expected.dtype, item.labels
        np.testing.assert_array_equal(derived, expected, err_msg=str(item.labels))
        kinds.add(item.kind)
    assert kinds == {"clean", "attack", "corruption", "sequence", "system_noise"}
    # some examples misclassified clean are classified correctly once attacked (the attack did
    # not succeed); the outcomes count none of them as robust
    clean = records.outcome(PLAN, items[0], stored)[0]
    attacks = [item for item in items if item.kind == "attack"]
    assert any((~stored.load(record_name(PLAN, item)).arrays["success"] & ~clean).any() for item in attacks)
    for item in attacks:
        assert not (records.outcome(PLAN, item, stored) & ~clean).any()


def test_an_item_the_records_lack_is_left_to_the_population():
    items = expand(PLAN)
    assert all(records.outcome(PLAN, item, MemoryStore()) is None for item in items)


def test_a_populations_attacks_read_its_clean_outcome_instead_of_classifying_again(monkeypatch):
    models = [rj.zoo.create("digits_mlp", pretrained=False, key=jax.random.key(seed)) for seed in (0, 1)]
    plan = plan_from_dict({"batch_size": 32, "num_examples": 32, "attacks": [{"name": "fgsm", "eps": 0.1}]})
    passes = []  # batches classified clean: one batch of 32
    original = items._classify
    def counted(*args):
        passes.append(1)
        return original(*args)

    counted.lower = original.lower  # the memory analysis compiles the program without running it
    monkeypatch.setattr(items, "_classify", counted)
    (first, second) = evaluate_population_batch(Population.stack(models), rj.data.digits("test"), plan)
    assert len(passes) == 1  # the clean item's
    for result, model in zip((first, second), models):
        alone = evaluate(model, rj.data.digits("test"), plan)
        assert result["attacks"][0]["robust_accuracy"] == alone["attacks"][0]["robust_accuracy"]


def test_a_populations_sections_hold_each_kind_with_the_figures_of_evaluate():
    model, dataset = rj.zoo.create("digits_mlp", pretrained=False), rj.data.digits("test")
    plan = plan_from_dict({"batch_size": 16, "num_examples": 16, "sanity": {"enabled": False},
                           "sequences": {"names": ["brightness"], "length": 3, "batch_size": 8},
                           "system_noise": {"decoders": ["pil"], "resizes": ["pil-nearest"]}})
    report = evaluate(model, dataset, plan)
    (result,) = evaluate_population_batch(Population.stack([model]), dataset, plan)
    assert result["sequences"] == [{key: r[key] for key in ("name", "flip_probability", "top5_distance")}
                                   for r in report["sequences"]["results"]]
    assert [{key: r[key] for key in ("decoder", "resize", "accuracy")} for r in result["system_noise"]] == \
        report["system_noise"]["results"]
