"""The metrics section of ``robustjax evaluate``: the 23 metrics, grouped, with directions,
streamed over padded, sharded batches, on the adversarial examples of the attack entry they
name; CA, AAW, ASR, AAB and mCE read from the records of the clean, attack and corruption items."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

import robustjax as rj
from robustjax.evaluation import items, metric_suite, resume, runner
from robustjax.evaluation.items import CLEAN, attack_item, corruption_item, record_name
from robustjax.evaluation.plan import plan_from_dict
from robustjax.metrics import behaviour
from robustjax.report import schema

# FGSM has no randomness, so every metric is a deterministic function of the data and the
# values must not depend on how the examples are batched.
SMALL = {
    "attack": {"name": "fgsm", "eps": 0.2},
    "reference": "digits_mlp",
    "ebd_directions": 8,
    "ebd2_step": 0.02,
    "ebd2_max_steps": 20,
    "rgb_sigma": 0.5,
}
# deterministic, like FGSM
CORRUPTIONS = {"names": ["brightness", "contrast"], "severities": [3, 5], "baseline": "reference"}


def _plan(batch_size: int, num_examples: int = 40, corruptions: dict | None = CORRUPTIONS, **metrics):
    return plan_from_dict({"batch_size": batch_size, "num_examples": num_examples, "metrics": {**SMALL, **metrics},
                           "sanity": {"enabled": False}, **({"corruptions": corruptions} if corruptions else {})})


@pytest.fixture(scope="module")
def models():
    return rj.zoo.create("digits_cnn"), rj.zoo.create("digits_mlp")


@pytest.fixture(scope="module")
def datasets():
    return rj.data.digits("test"), rj.data.digits("train")


@pytest.fixture(scope="module")
def stored(models, datasets, tmp_path_factory):
    """The report of the small plan, and the item store its records were kept in."""
    model, reference = models
    test, train = datasets
    plan = _plan(16)
    fingerprint = resume.fingerprint(model, test, plan, {}, profile=train, reference=reference)
    with resume.ItemStore.open(tmp_path_factory.mktemp("items"), fingerprint) as store:
        report = rj.evaluation.evaluate(model, test, plan, profile=train, reference=reference, store=store)
        yield report, {part: store.load(name) for part, name in runner.item_names(plan).items()}, store


@pytest.fixture(scope="module")
def report(stored):
    return stored[0]


def _by_name(report) -> dict[str, dict]:
    return {entry["name"]: entry for entry in report["metrics"]["results"]}


def test_all_23_metrics_are_reported_in_the_papers_groups_with_directions(report):
    jsonschema.validate(report, schema())
    section = report["metrics"]
    assert section["status"] == "ok" and report["status"] == "complete"
    entries = section["results"]
    assert sorted({e["index"] for e in entries if e["index"] is not None}) == list(range(1, 24))
    assert [e["group"] for e in entries] == sorted((e["group"] for e in entries), key=metric_suite.GROUPS.index)
    for entry in entries:
        assert entry["status"] == "ok", entry
        assert math.isfinite(entry["value"]) and entry["direction"] in ("higher", "lower")
    by_name = _by_name(report)
    assert by_name["ASS"]["settings"]["window"] == 7  # 8x8 images: the largest odd window that fits
    assert by_name["KMNC"]["settings"]["bounds_profiled_on"] == "digits/train"
    assert by_name["AAB"]["settings"]["source"] == "digits_mlp"


def test_values_agree_with_the_other_sections_and_with_each_other(report):
    values = {name: entry["value"] for name, entry in _by_name(report).items()}
    assert values["CA"] == report["clean"]["accuracy"]
    assert values["AAW"] + values["ASR"] == pytest.approx(1.0)  # untargeted, over every example
    assert values["CAV"] == pytest.approx(values["CRR"] - values["CSR"])
    assert 0 <= values["SNAC"] <= 1 and values["NBC"] >= values["SNAC"] / 2
    assert 1 <= values["TKNP"] <= 40 and values["TKNP"] == int(values["TKNP"])
    # one mCE: the corruption section's, against the reference's errors on the same images
    assert values["mCE"] == report["corruptions"]["mce"] and values["relative_mCE"] == report["corruptions"]["relative_mce"]
    assert _by_name(report)["mCE"]["settings"]["baseline"] == "reference"


def test_aaw_aab_and_mce_are_the_stored_records_of_the_items_they_name(stored):
    report, items, store = stored
    plan = _plan(16)
    values = {name: entry["value"] for name, entry in _by_name(report).items()}
    clean_correct = store.load(record_name(plan, CLEAN)).arrays["outcome"][0]
    # the metrics' FGSM at eps 0.2 is not among the plan's attacks: it is added as the last entry
    (entry,) = [a for a in report["attacks"] if a["name"] == "fgsm"]
    assert _by_name(report)["AAW"]["settings"]["entry"] == "fgsm eps=0.2"
    attack = store.load(record_name(plan, attack_item(plan.runs[-1]))).arrays
    under_attack = ~attack["success"][0]  # AAW: accuracy on the adversarial examples of every example
    assert values["AAW"] == under_attack.mean()
    assert entry["robust_accuracy"] == (under_attack & clean_correct).mean() == attack["outcome"][0].mean()
    differ = int((under_attack & ~clean_correct).sum())
    assert f"differ by {differ} such example(s) of 40" in _by_name(report)["AAW"]["settings"]["differs_from_robust_accuracy"]
    assert values["AAB"] == items["metrics"].arrays["transfer_correct"].mean()
    # mCE from the corruption items' per-example records of the model and the reference
    records = [[store.load(record_name(plan, corruption_item(plan, index, severity))).arrays
                for severity in plan.corruptions.severities] for index in range(len(CORRUPTIONS["names"]))]
    errors = np.array([[1 - r["outcome"].mean() for r in severities] for severities in records])
    baseline = np.array([[1 - r["reference_outcome"].mean() for r in severities] for severities in records])
    assert errors.shape == baseline.shape == (2, 2)
    assert values["mCE"] == pytest.approx(np.mean(errors.sum(1) / baseline.sum(1)), rel=1e-6)


def test_streamed_values_do_not_depend_on_batching_or_padding(report, models, datasets):
    model, reference = models
    test, train = datasets
    # 40 examples in batches of 16 pad the last batch with 8 copies; one batch of 40 pads none.
    other = rj.evaluation.evaluate(model, test, _plan(40), profile=train, reference=reference)
    for name, entry in _by_name(other).items():
        # float32 sums in a different order
        assert entry["value"] == pytest.approx(_by_name(report)[name]["value"], rel=1e-5, abs=1e-6), name


def test_section_values_equal_the_library_functions_on_the_same_examples(report, models, datasets):
    model, _ = models
    x, y = datasets[0].arrays(limit=40)
    attack = rj.attacks.create("fgsm", eps=0.2)
    x_adv = attack(model, x, y, key=jax.random.key(0)).x_adv
    logits_adv = model(x_adv)
    values = {name: entry["value"] for name, entry in _by_name(report).items()}
    assert values["ACAC"] == pytest.approx(float(behaviour.average_confidence_adversarial_class(logits_adv, y)), rel=1e-5)
    assert values["NTE"] == pytest.approx(float(behaviour.noise_tolerance_estimation(logits_adv, y)), rel=1e-5)
    success = behaviour.attack_success(logits_adv, jnp.asarray(y))
    ald = rj.metrics.imperceptibility.average_lp_distortion(x, x_adv, success)
    assert values["ALD_2"] == pytest.approx(float(ald.l2), rel=1e-5)
    blurred = model(behaviour.blur_for_rgb(x_adv, 0.5))
    assert values["RGB"] == pytest.approx(float(behaviour.robustness_to_gaussian_blur(logits_adv, blurred, y)), rel=1e-5)


def test_aaw_counts_every_example_the_attack_leaves_correctly_classified(datasets):
    """AAW (accuracy under the white-box attack) is over every example's adversarial example,
    robust accuracy only over those classified correctly clean: on random weights FGSM's
    step of 1 moves some misclassified examples onto their true class, and AAW counts them."""
    model = rj.zoo.create("digits_cnn", pretrained=False)
    plan = _plan(32, num_examples=64, corruptions=None, reference=None, attack={"name": "fgsm", "eps": 1.0})
    store = resume.MemoryStore()
    report = rj.evaluation.evaluate(model, datasets[0], plan, store=store)
    clean_correct = store.load(record_name(plan, CLEAN)).arrays["outcome"][0]
    under_attack = ~store.load(record_name(plan, attack_item(plan.runs[-1]))).arrays["success"][0]
    differ = int((under_attack & ~clean_correct).sum())
    assert differ > 0
    aaw = _by_name(report)["AAW"]
    assert aaw["value"] == under_attack.mean() == report["attacks"][-1]["robust_accuracy"] + differ / 64
    assert f"differ by {differ} such example(s) of 64" in aaw["settings"]["differs_from_robust_accuracy"]


def test_missing_inputs_are_reported_as_skipped_with_a_reason(models, datasets):
    model, _ = models
    plan = _plan(20, num_examples=20, corruptions=None, reference=None)
    report = rj.evaluation.evaluate(model, datasets[0], plan)
    entries = _by_name(report)
    for name in ("KMNC", "NBC", "SNAC", "AAB", "mCE", "relative_mCE", "CAV", "COS"):
        assert entries[name]["status"] == "skipped" and entries[name]["value"] is None
    assert "reference model" in entries["AAB"]["reason"] and "profiling set" in entries["KMNC"]["reason"]
    assert "no [corruptions] table" in entries["mCE"]["reason"]
    assert entries["TKNC"]["status"] == entries["EBD"]["status"] == "ok"
    assert report["metrics"]["status"] == "ok"
    jsonschema.validate(report, schema())


def test_a_profiling_set_of_another_image_size_is_skipped_by_name(models, datasets):
    model, _ = models
    x, y = datasets[1].arrays(limit=8)
    larger = rj.data.from_arrays(np.pad(x, ((0, 0), (4, 4), (4, 4), (0, 0))), y, name="padded digits", num_classes=10)
    plan = _plan(20, num_examples=20, corruptions=None, reference=None)
    entries = _by_name(rj.evaluation.evaluate(model, datasets[0], plan, profile=larger))
    for name in ("KMNC", "NBC", "SNAC"):
        assert entries[name]["status"] == "skipped"
        assert "'padded digits' holds images of shape (16, 16, 1)" in entries[name]["reason"]
        assert "takes (8, 8, 1)" in entries[name]["reason"]
    assert entries["TKNC"]["status"] == "ok"


def test_a_metric_undefined_on_the_data_has_no_value_but_a_reason(models, datasets):
    model, reference = models
    x, y = datasets[0].arrays(limit=40)
    correct = np.asarray(jnp.argmax(model(x), -1)) == y
    dataset = rj.data.from_arrays(x[correct][:16], y[correct][:16], name="correct digits", num_classes=10)
    # eps 0 on correctly classified examples fools none: metrics over the success set are undefined.
    plan = _plan(16, num_examples=16, corruptions=None, attack={"name": "fgsm", "eps": 0.0})
    entries = _by_name(rj.evaluation.evaluate(model, dataset, plan, profile=datasets[1], reference=reference))
    for name in ("ACAC", "NTE", "ASS", "RGB"):
        assert entries[name]["status"] == "undefined" and entries[name]["value"] is None
        assert "no successful adversarial examples" in entries[name]["reason"]
    assert entries["AAW"]["status"] == "ok"


def test_failed_corruptions_leave_mce_without_a_value_and_keep_the_other_metrics(models, datasets, monkeypatch):
    model, reference = models

    def broken(*args, **kwargs):
        raise RuntimeError("corruption exploded")

    monkeypatch.setattr(items, "_corrupt", broken)
    plan = _plan(20, num_examples=20, corruptions={**CORRUPTIONS, "names": ["brightness"], "severities": [1]})
    report = rj.evaluation.evaluate(model, datasets[0], plan, profile=datasets[1], reference=reference)
    entries = _by_name(report)
    assert report["corruptions"]["status"] == "incomplete"
    assert "corruption exploded" in report["corruptions"]["failed"][0]["error"]
    assert entries["mCE"]["value"] is None and "the corruption section has none" in entries["mCE"]["reason"]
    assert entries["CA"]["status"] == entries["AAW"]["status"] == "ok"
    assert report["status"] == "incomplete"


def test_a_reference_for_other_inputs_is_refused(models, datasets):
    model, _ = models
    other = rj.zoo.create("digits_cnn", pretrained=False, num_classes=5)
    report = rj.evaluation.evaluate(model, datasets[0], _plan(20, num_examples=20), reference=other)
    assert report["metrics"]["status"] == "failed" and "predicts 5 classes" in report["metrics"]["error"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kmnc_sections": 0}, "metrics.kmnc_sections must be an integer >= 1"),
        ({"tknp_k": 1.5}, "metrics.tknp_k must be an integer >= 1"),
        ({"ric_quality": 101}, "metrics.ric_quality must be an integer from 1 to 100"),
        ({"rgb_sigma": -1}, "metrics.rgb_sigma must be a number > 0"),
        ({"attack": {"name": "pgd", "eps": [0.1, 0.2]}}, "metrics.attack takes one eps"),
        ({"attack": {"name": "nope"}}, "metrics.attack"),
        ({"conv_neuron": "pixel"}, "conv_neuron"),
        ({"mce_baseline": "alexnet"}, "metrics.mce_baseline is no longer a [metrics] key"),
        ({"corruptions": ["fog"]}, "mCE and relative mCE come from the plan's [corruptions] table"),
        ({"colour": 1}, "[metrics]: unknown key(s) 'colour'"),
    ],
)
def test_bad_metrics_settings_are_refused_when_the_plan_is_read(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        plan_from_dict({"metrics": {**SMALL, **change}})


def test_the_digits_plan_computes_the_metrics_by_default():
    plan = rj.evaluation.default_plan("digits/test")
    assert plan.metrics is not None and plan.metrics.reference == "digits_mlp"
    assert len(plan.corruptions.names) == 15 and plan.corruptions.severities == (1, 2, 3, 4, 5)
    assert plan.corruptions.baseline == "reference"
    assert dataclasses.asdict(plan.metrics.attack)["eps"] == 0.1
    # the metrics read the PGD entry's examples at eps 0.1: no attack is added for them
    assert len(plan.runs) == 2 and plan.metrics_source() == (1, 1)


def test_a_reference_baseline_needs_a_reference_model():
    with pytest.raises(ValueError, match=r'baseline = "reference" needs a reference model: set metrics.reference'):
        plan_from_dict({"corruptions": CORRUPTIONS})


def test_a_model_with_nan_outputs_is_refused_before_any_metric(models, datasets):
    model, _ = models
    broken = model.replace(apply_fn=lambda params, x: model.apply_fn(params, x) * jnp.nan, name="nan model")
    plan = _plan(16, num_examples=16, corruptions=None, reference=None)
    with pytest.raises(ValueError, match=r"'nan model' returns NaN or infinite logits for 16 of the 16"):
        rj.evaluation.evaluate(broken, datasets[0], plan, profile=datasets[1])
