"""Corruptions in evaluation plans and reports, and the corruption-error summaries."""

import jax
import jsonschema
import numpy as np
import pytest

import robustjax as rj
from robustjax import metrics
from robustjax.evaluation import Plan, evaluate, items, plan_from_dict, runner
from robustjax.evaluation.plan import CorruptionRun
from robustjax.report import schema

IMAGENET_C = ["gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
              "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
              "jpeg_compression"]


def test_named_sets_expand_to_the_benchmark_corruptions():
    run = plan_from_dict({"corruptions": {}}).corruptions
    assert sorted(run.names) == sorted(IMAGENET_C) and run.severities == (1, 2, 3, 4, 5)
    everything = plan_from_dict({"corruptions": {"names": "all"}}).corruptions.names
    assert sorted(everything) == sorted(IMAGENET_C + ["speckle_noise", "gaussian_blur", "spatter", "saturate"])


@pytest.mark.parametrize("table, message", [
    ({"names": ["fogg"]}, r"unknown corruption 'fogg' \(did you mean 'fog'"),
    ({"names": []}, "non-empty list"),
    ({"severities": [0, 6]}, "severity must be an integer from 1 to 5, got 0"),
    ({"preset": "tiny"}, "preset must be one of"),
    ({"names": ["speckle_noise"], "baseline": "alexnet"}, r"no errors for \['speckle_noise'\]"),
    ({"severities": [1, 2], "baseline": "alexnet"}, "needs all severities"),
    ({"baseline": "vgg"}, "baseline must be one of"),
    ({"levels": [1]}, r"\[corruptions\]: unknown key\(s\) 'levels'"),
])
def test_malformed_corruption_tables_are_named(table, message):
    with pytest.raises(ValueError, match=message):
        plan_from_dict({"corruptions": table})


def test_alexnet_errors_give_the_published_corruption_errors():
    # Hendrycks & Dietterich (2019), Table: AlexNet's CE is by definition 100 on every
    # corruption; its unnormalised mean errors are the published 88.6 (Gaussian) ... 60.7 (JPEG).
    errors = np.array(list(metrics.ALEXNET_IMAGENET_C_ERRORS.values()))
    np.testing.assert_allclose(metrics.corruption_error(errors, errors), 1.0)
    means = dict(zip(metrics.ALEXNET_IMAGENET_C_ERRORS, metrics.mean_corruption_error(errors)))
    assert means["gaussian_noise"] == pytest.approx(0.886428, abs=1e-6)
    assert means["jpeg_compression"] == pytest.approx(0.60650, abs=1e-5)


def test_summary_by_hand():
    run = CorruptionRun(names=("fog", "contrast"), baseline="alexnet")
    fog = [0.1, 0.2, 0.3, 0.4, 0.5]
    contrast = [0.5] * 5
    results = [{"name": n, "family": "weather" if n == "fog" else "digital", "severity": s + 1,
                "accuracy": 1 - e, "error": e}
               for n, errs in (("fog", fog), ("contrast", contrast)) for s, e in enumerate(errs)]
    summary = runner.corruption_summary(results, run, clean_error=0.05)
    base = metrics.ALEXNET_IMAGENET_C_ERRORS
    ce_fog = sum(fog) / sum(base["fog"])
    ce_contrast = sum(contrast) / sum(base["contrast"])
    rel_fog = sum(e - 0.05 for e in fog) / sum(e - metrics.ALEXNET_CLEAN_ERROR for e in base["fog"])
    assert summary["per_corruption"][0]["ce"] == pytest.approx(ce_fog)
    assert summary["per_corruption"][0]["relative_ce"] == pytest.approx(rel_fog)
    assert summary["mce"] == pytest.approx((ce_fog + ce_contrast) / 2)
    assert summary["mean_error"] == pytest.approx((0.3 + 0.5) / 2)
    assert summary["mean_error_by_family"] == pytest.approx({"weather": 0.3, "digital": 0.5})


def test_a_reference_baseline_is_normalised_by_its_own_errors_and_undefined_where_it_does_not_degrade():
    run = CorruptionRun(names=("fog", "contrast"), severities=(1, 2), baseline="reference")
    rows = {"fog": ([0.2, 0.4], [0.3, 0.5]), "contrast": ([0.1, 0.1], [0.1, 0.1])}  # (model, reference) errors
    results = [{"name": n, "family": "weather" if n == "fog" else "digital", "severity": s + 1, "accuracy": 1 - e,
                "error": e, "baseline_error": b} for n, (errs, base) in rows.items()
               for s, (e, b) in enumerate(zip(errs, base))]
    # the reference errs 0.1 on clean images: as much as under contrast, so contrast's relative CE is undefined
    summary = runner.corruption_summary(results, run, clean_error=0.05, baseline_clean_error=0.1)
    assert summary["per_corruption"][0]["ce"] == pytest.approx(0.6 / 0.8)
    assert summary["per_corruption"][0]["relative_ce"] == pytest.approx((0.15 + 0.35) / (0.2 + 0.4))
    assert summary["mce"] == pytest.approx((0.6 / 0.8 + 1.0) / 2)
    assert summary["relative_mce"] is None and summary["per_corruption"][1]["relative_ce"] is None
    assert "makes no more error than on clean images under ['contrast']" in summary["relative_mce_reason"]


@pytest.fixture(scope="module")
def corruption_report(digits_clf):
    plan = Plan(runs=(), corruptions=CorruptionRun(names=("brightness", "gaussian_noise"), severities=(1, 5)),
                batch_size=40, num_examples=60)
    updates = []
    report = evaluate(digits_clf, rj.data.digits("test"), plan,
                      on_update=lambda r: updates.append(r["corruptions"] and len(r["corruptions"]["results"])))
    return report, updates


def test_corruption_report_follows_the_schema(corruption_report):
    report, updates = corruption_report
    jsonschema.validate(report, schema())
    section = report["corruptions"]
    assert report["status"] == "complete" and section["status"] == "ok" and section["preset"] == "cifar"
    assert [(r["name"], r["severity"]) for r in section["results"]] == [
        ("brightness", 1), ("brightness", 5), ("gaussian_noise", 1), ("gaussian_noise", 5)]
    assert updates[:3] == [None, 2, 4]  # written after the clean pass and after each corruption
    assert section["mce"] is None and section["timing"]["images_per_s"] > 0


def test_corruption_accuracy_matches_a_direct_computation(corruption_report, digits_clf):
    report, _ = corruption_report
    x, y = rj.data.digits("test").arrays(limit=60)
    # The runner folds the seed, the corruption's index, the severity and the batch into the key:
    # brightness is deterministic, so the direct computation needs no key bookkeeping.
    corrupted = rj.noise.corrupt(x, "brightness", 5, jax.random.key(0))
    accuracy = float(np.mean(np.asarray(digits_clf(corrupted)).argmax(-1) == y))
    assert report["corruptions"]["results"][1]["accuracy"] == pytest.approx(accuracy)


def test_a_failing_corruption_is_recorded_and_the_rest_still_run(digits_clf, monkeypatch):
    real = items._corrupt

    def flaky(name, severity, preset, x, key):
        if name == "brightness":
            raise RuntimeError("broken corruption")
        return real(name, severity, preset, x, key)

    monkeypatch.setattr(items, "_corrupt", flaky)
    plan = Plan(runs=(), corruptions=CorruptionRun(names=("brightness", "contrast"), severities=(2,)),
                batch_size=40, num_examples=40)
    report = evaluate(digits_clf, rj.data.digits("test"), plan)
    jsonschema.validate(report, schema())
    assert report["status"] == "incomplete" and report["corruptions"]["status"] == "incomplete"
    assert report["corruptions"]["failed"] == [{"name": "brightness", "error": "RuntimeError: broken corruption"}]
    assert [r["name"] for r in report["corruptions"]["results"]] == ["contrast"]


def test_sequence_tables_are_validated():
    run = plan_from_dict({"sequences": {"names": ["rotate", "gaussian_noise"], "difficulty": 2}}).sequences
    assert run.names == ("rotate", "gaussian_noise") and run.difficulty == 2 and run.batch_size == 16
    assert len(plan_from_dict({"sequences": {}}).sequences.names) == 14
    for table, message in [({"names": ["spin"]}, "unknown perturbation 'spin'"),
                           ({"difficulty": 4}, "difficulty must be 1, 2 or 3"),
                           ({"length": 1}, "length must be an integer >= 2"),
                           ({"batch_size": 0}, "sequences.batch_size must be an integer >= 1"),
                           ({"frames": 3}, r"\[sequences\]: unknown key\(s\) 'frames'")]:
        with pytest.raises(ValueError, match=message):
            plan_from_dict({"sequences": table})


def test_sequence_report(digits_clf):
    plan = plan_from_dict({"num_examples": 12, "sanity": {"enabled": False}, "sequences": {"names": ["brightness", "shot_noise"], "length": 4,
                                                             "batch_size": 8}})
    report = evaluate(digits_clf, rj.data.digits("test"), plan)
    jsonschema.validate(report, schema())
    section = report["sequences"]
    assert section["status"] == "ok" and [r["name"] for r in section["results"]] == ["brightness", "shot_noise"]
    x, _ = rj.data.digits("test").arrays(limit=12)
    # brightness sequences are deterministic: a direct call on all 12 images gives the same mean.
    direct = rj.noise.evaluate_sequences(digits_clf, x, "brightness", jax.random.key(0), length=4)
    assert section["results"][0]["flip_probability"] == pytest.approx(float(direct["flip_probability"]))
    assert section["mean_flip_probability"] == pytest.approx(
        np.mean([r["flip_probability"] for r in section["results"]]))
    assert timed_examples(section["timing"]) == pytest.approx(2 * 12, rel=0.05)  # every sequence's images


def test_system_noise_tables_are_validated():
    run = plan_from_dict({"system_noise": {"decoders": ["pil"], "resizes": ["pil-box", "opencv-area"]}}).system_noise
    assert [v.name for v in run.variants()] == ["pil+pil-box", "pil+opencv-area"] and run.quality == 95
    for table, message in [({"decoders": ["libjpeg"]}, "unknown decoder 'libjpeg'"),
                           ({"resizes": ["pil-spline"]}, "unknown resize mode 'pil-spline'"),
                           ({"resizes": []}, "non-empty list"),
                           ({"quality": 0}, "quality must be an integer from 1 to 100"),
                           ({"interpolation": "x"}, r"\[system_noise\]: unknown key\(s\) 'interpolation'")]:
        with pytest.raises(ValueError, match=message):
            plan_from_dict({"system_noise": table})


def test_system_noise_report(digits_clf):
    plan = plan_from_dict({"num_examples": 30, "batch_size": 16, "sanity": {"enabled": False}, "system_noise": {
        "decoders": ["pil", "opencv"], "resizes": ["pil-nearest", "pil-bicubic", "opencv-area"]}})
    report = evaluate(digits_clf, rj.data.digits("test"), plan)
    jsonschema.validate(report, schema())
    section = report["system_noise"]
    assert report["status"] == "complete" and len(section["results"]) == 6
    accuracies = [r["accuracy"] for r in section["results"]]
    assert section["mean_accuracy"] == pytest.approx(np.mean(accuracies))
    assert section["negative_std"] == pytest.approx(-np.std(accuracies))
    assert all(0.5 < a <= 1.0 for a in accuracies)  # the digits CNN still sees digits
    assert timed_examples(section["timing"]) == pytest.approx(6 * 30, rel=0.05)  # every variant's images


def timed_examples(timing: dict) -> float:
    """The examples a section's throughput counts: images/s times the seconds not compiling."""
    return timing["images_per_s"] * (timing["wall_s"] - timing["compile_s"])
