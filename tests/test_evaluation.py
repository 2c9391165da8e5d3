import dataclasses

import jsonschema
import numpy as np
import pytest

import robustjax as rj
from robustjax.attacks.base import Attack
from robustjax.evaluation import AttackRun, Plan, evaluate, runner
from robustjax.evaluation.plan import SanityRun
from robustjax.report import schema, write_report


@dataclasses.dataclass(frozen=True)
class BrokenAttack(Attack):
    name = "broken"

    def run(self, classifier, x, y, key, target):
        raise RuntimeError("this attack always fails")


@pytest.fixture(scope="module")
def small_report(digits_clf):
    plan = Plan(runs=(AttackRun(rj.attacks.FGSM(eps=0.1)), AttackRun(rj.attacks.PGD(steps=5), eps=(0.1, 0.2), restarts=2)),
                batch_size=20, num_examples=50)
    updates = []
    report = evaluate(digits_clf, rj.data.digits("test"), plan, on_update=lambda r: updates.append(len(r["attacks"])))
    return report, updates


def test_report_follows_the_schema(small_report, tmp_path):
    report, _ = small_report
    jsonschema.validate(report, schema())
    write_report(tmp_path / "out" / "report.json", report)
    assert (tmp_path / "out" / "report.json").read_text().startswith("{")
    assert report["status"] == "complete" and report["dataset"]["num_examples"] == 50
    assert report["environment"]["device_count"] == 8


def test_counts_ignore_the_padding_of_the_last_batch(small_report, digits_clf):
    report, _ = small_report
    x, y = rj.data.digits("test").arrays(limit=50)  # 50 examples: batches of 24, 24, 2 (+22 padding)
    expected = float(np.mean(np.argmax(digits_clf(x), -1) == y))
    assert report["clean"]["accuracy"] == pytest.approx(expected)
    assert report["clean"]["num_correct"] == round(expected * 50)


def test_robust_accuracy_is_consistent(small_report):
    report, _ = small_report
    clean = report["clean"]
    fgsm, pgd_small, pgd = report["attacks"]
    assert (pgd_small["params"]["eps"], pgd["params"]["eps"]) == (0.1, 0.2)
    assert pgd["params"]["restarts"] == 2 and pgd["timing"]["grid_size"] == 2
    assert pgd["robust_accuracy"] <= pgd_small["robust_accuracy"]
    for section in (fgsm, pgd_small, pgd):
        assert section["robust_accuracy"] <= clean["accuracy"]
        robust_count = round(section["robust_accuracy"] * 50)
        assert robust_count + section["num_adversarial"] == clean["num_correct"]
        assert section["perturbation"]["linf_mean"] <= section["params"]["eps"] + 1e-6
        assert section["timing"]["compile_s"] > 0
    assert pgd["robust_accuracy"] < clean["accuracy"]
    assert fgsm["queries_mean"] == 2.0 and pgd["queries_mean"] <= 2 * 6.0  # two restarts of 5 steps + check


def test_worst_case_over_the_attacks_that_share_a_budget(small_report, digits_clf):
    report, _ = small_report
    (worst,) = report["worst_case"]  # FGSM and PGD share linf 0.1; PGD alone has 0.2
    fgsm, pgd_small, _ = report["attacks"]
    assert (worst["norm"], worst["eps"], worst["attacks"]) == ("linf", 0.1, ["fgsm", "pgd"])
    assert worst["robust_accuracy"] <= min(fgsm["robust_accuracy"], pgd_small["robust_accuracy"])
    # Each example is robust at most once per attack: the worst case loses at most the sum.
    lost = fgsm["num_adversarial"] + pgd_small["num_adversarial"]
    assert round(worst["robust_accuracy"] * 50) >= report["clean"]["num_correct"] - lost
    assert worst["wcar"] == pytest.approx(worst["robust_accuracy"] * 50 / report["clean"]["num_correct"])


def test_clean_calibration_matches_the_library_functions(small_report, digits_clf):
    report, _ = small_report
    x, y = rj.data.digits("test").arrays(limit=50)
    logits = digits_clf(x)
    confidence, correct = rj.metrics.calibration.max_softmax(logits), np.argmax(logits, -1) == y
    calibration = report["clean"]["calibration"]
    assert calibration["expected_calibration_error"] == pytest.approx(
        float(rj.metrics.calibration.expected_calibration_error(confidence, correct)), abs=1e-6)
    assert calibration["aurra"] == pytest.approx(float(rj.metrics.calibration.aurra(confidence, correct)), abs=1e-6)


def test_report_is_handed_over_after_every_section(small_report):
    _, updates = small_report
    assert updates == [0, 1, 3, 3, 3]  # the clean pass, each attack run, the sanity checks, the end


def test_a_failing_attack_is_recorded_and_the_plan_goes_on(digits_clf):
    plan = Plan(runs=(AttackRun(BrokenAttack()), AttackRun(rj.attacks.FGSM(eps=0.1))), batch_size=16, num_examples=16,
                sanity=SanityRun(enabled=False))
    report = evaluate(digits_clf, rj.data.digits("test"), plan)
    jsonschema.validate(report, schema())
    broken, fgsm = report["attacks"]
    assert broken["status"] == "failed" and "always fails" in broken["error"]
    assert fgsm["status"] == "ok"
    assert report["status"] == "incomplete"


def test_dataset_and_model_must_fit(digits_clf):
    images = np.zeros((4, 16, 16, 1), np.float32)
    with pytest.raises(ValueError, match=r"shape \(16, 16, 1\), model 'digits_cnn' expects \(8, 8, 1\)"):
        evaluate(digits_clf, rj.data.from_arrays(images, np.arange(4)), Plan(runs=()))


def test_worst_case_skips_attacks_without_a_ball():
    """Minimal-norm attacks (eps None, as RayS without a budget) share no threat model."""
    clean = np.array([True, True, False])
    unbounded = [({"name": name, "params": {"norm": "linf", "eps": None}}, np.array([True, False, False]))
                 for name in ("rays", "fab")]
    bounded = [({"name": name, "params": {"norm": "linf", "eps": 0.1}}, np.array(mask))
               for name, mask in (("fgsm", [True, True, False]), ("pgd", [False, True, False]))]
    entries = runner.worst_case_section(unbounded + bounded, clean)
    assert [(e["eps"], e["attacks"], e["robust_accuracy"]) for e in entries] == [(0.1, ["fgsm", "pgd"], 1 / 3)]
