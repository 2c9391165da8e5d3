"""The sanity checks against gradient masking (robustjax.evaluation.sanity): each masked
model is flagged by the check that should catch it, a plain model by none, and the
report-only checks read constructed reports."""

import dataclasses

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest
from rich.console import Console

import robustjax as rj
from robustjax.attacks import flags
from robustjax.evaluation import Plan, plan_from_dict, progress, sanity
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import SanityRun
from robustjax.report import schema
from robustjax.report.summary import sanity_table

NUM_EXAMPLES = 32
EMPTY_REPORT = {"attacks": [], "metrics": None, "dataset": {"num_examples": NUM_EXAMPLES}}


def wrapped(base: rj.Classifier, name: str, transform) -> rj.Classifier:
    """``base`` with ``transform(logits_fn, x)`` around its forward pass, on raw [0, 1] images."""
    def apply_fn(params, x):
        return transform(lambda images: base.apply_fn(params, base.normalize(images)), x)

    return rj.Classifier(params=base.params, apply_fn=apply_fn, num_classes=base.num_classes,
                         input_shape=base.input_shape, name=name)


def quantised(logits, x):
    """Input quantisation to 4 levels: zero gradients almost everywhere."""
    return logits(jnp.round(x * 3) / 3)


def saturated_softmax(logits, x):
    """Probabilities of logits scaled by 100: the softmax saturates in float32."""
    return jax.nn.softmax(100 * logits(x))


_noise = np.random.default_rng(0)


def random_noise(logits, x):
    """Gaussian noise on the input, drawn on the host on every call."""
    noise = jax.pure_callback(lambda: _noise.normal(0, 0.05, x.shape).astype(np.float32),
                              jax.ShapeDtypeStruct(x.shape, jnp.float32))
    return logits(x + noise)


def batch_dependent(logits, x):
    """Inputs centred on the batch mean, as batch norm with batch statistics does."""
    return logits(x - x.mean(axis=0) + 0.3)


@pytest.fixture(scope="module")
def setting():
    """The first test digits, a plan whose checks use 32 of them, and the mesh."""
    images, labels = rj.data.digits("test").arrays(limit=2 * NUM_EXAMPLES)
    checks = SanityRun(num_examples=NUM_EXAMPLES, eps=0.2, steps=5, restarts=2)
    plan = Plan(runs=(), batch_size=2 * NUM_EXAMPLES, sanity=checks)
    return rj.data.from_arrays(images, labels), plan, DataParallel(plan.batch_size)


def clean_correct(classifier: rj.Classifier, dataset) -> np.ndarray:
    """Per example, whether ``classifier`` gets it right (the clean pass's record)."""
    x, y = dataset.arrays()
    return np.asarray(classifier(x)).argmax(-1) == y


def model_checks(classifier: rj.Classifier, setting, names: tuple[str, ...]) -> list[dict]:
    """The model-based checks ``names`` on ``classifier``."""
    dataset, plan, parallel = setting
    x, y = sanity.correct_examples(dataset, plan, clean_correct(classifier, dataset))
    classifier = parallel.replicate(classifier)
    probe = sanity.Probe(classifier, x, y, parallel, plan.sanity, plan.sanity.eps, jax.random.key(0))
    return [sanity.MODEL_CHECKS[name](probe) for name in names]


def verdicts(classifier: rj.Classifier, setting, names: tuple[str, ...]) -> list[str]:
    return [check["verdict"] for check in model_checks(classifier, setting, names)]


def test_a_plain_model_passes_every_check(setting, digits_clf):
    """... and the progress counts one unit per check of the section, as the runner's step
    (of ``len(CHECKS)`` checks) expects."""
    dataset, plan, parallel = setting
    events = []
    with progress.step(events.append, "sanity", len(sanity.CHECKS), "checks") as current:
        section = sanity.sanity_section(parallel.replicate(digits_clf), dataset, plan, parallel, EMPTY_REPORT,
                                        clean_correct(digits_clf, dataset), step=current)
    assert [event.done for event in events] == [*range(len(section["checks"]) + 1), len(sanity.CHECKS)]
    jsonschema.validate({"sanity": section}, {"$defs": schema()["$defs"],
                                              "properties": {"sanity": schema()["properties"]["sanity"]}})
    assert section["num_examples"] == NUM_EXAMPLES and section["num_warnings"] == 0
    found = {check["name"]: check["verdict"] for check in section["checks"]}
    assert {name: found[name] for name in sanity.MODEL_CHECKS} == dict.fromkeys(sanity.MODEL_CHECKS, "pass")


def test_quantised_inputs_are_flagged(setting, digits_clf):
    names = ("input_gradients", "loss_landscape", "unbounded_pgd")
    assert verdicts(wrapped(digits_clf, "quantised", quantised), setting, names) == ["warn"] * 3


def test_saturated_softmax_outputs_are_flagged(setting, digits_clf):
    names = ("probability_outputs", "input_gradients")
    assert verdicts(wrapped(digits_clf, "softmax", saturated_softmax), setting, names) == ["warn"] * 2


@pytest.mark.parametrize("transform, changed_on_repeated_call", [(random_noise, True), (batch_dependent, False)])
def test_a_random_or_batch_dependent_forward_pass_is_flagged(setting, digits_clf, transform, changed_on_repeated_call):
    [check] = model_checks(wrapped(digits_clf, transform.__name__, transform), setting, ("deterministic_forward",))
    distances = check["value"]["max_distance"]
    assert check["verdict"] == "warn" and distances["other_batch"] > flags.RANDOMNESS_TOLERANCE
    assert (distances["repeated_call"] > flags.RANDOMNESS_TOLERANCE) == changed_on_repeated_call


def test_log_probabilities_are_flagged_and_logits_are_not():
    logits = np.random.default_rng(1).normal(0, 5, (16, 10)).astype(np.float32)
    assert sanity.probability_outputs(np.asarray(jax.nn.log_softmax(logits)))["verdict"] == "warn"
    assert sanity.probability_outputs(logits)["verdict"] == "pass"


def test_zero_and_nan_gradients_are_flagged():
    gradient = np.random.default_rng(2).normal(size=(4, 8, 8, 1)).astype(np.float32)
    margin = np.ones(4, np.float32)
    assert sanity.input_gradients(margin, gradient)["verdict"] == "pass"
    gradient[1] = 0.0
    gradient[2, 0, 0, 0] = np.nan
    check = sanity.input_gradients(margin, gradient)
    assert check["verdict"] == "warn" and check["value"] == {"zero": 0.25, "not_finite": 0.25, "vanishing": 0.25}


def test_restarts_that_still_fool_new_examples_are_flagged():
    success = np.zeros((4, 32), bool)
    success[0, :8] = True
    success[3, 8] = True  # one more example in the last restart: within the noise
    assert sanity.restarts_converged(success, 0.1, 10)["verdict"] == "pass"
    success[2:, 9] = True  # a second one: more than one example and 1%
    assert sanity.restarts_converged(success, 0.1, 10)["verdict"] == "warn"


def test_a_flat_or_jumping_loss_landscape_is_flagged():
    sizes = np.linspace(0, 0.2, 9)
    rising = np.outer(sizes, np.ones(10)) + np.random.default_rng(3).uniform(0, 1e-3, (9, 10))
    assert sanity.loss_landscape(rising, sizes)["verdict"] == "pass"
    flat, jump = rising.copy(), rising.copy()
    flat[:, :3] = 1.0
    jump[5:, :3] += 10.0
    assert sanity.loss_landscape(flat, sizes)["value"]["flat"] == 0.3
    assert sanity.loss_landscape(jump, sizes)["value"]["irregular"] == 0.3
    assert sanity.loss_landscape(flat, sizes)["verdict"] == sanity.loss_landscape(jump, sizes)["verdict"] == "warn"


def section(name, eps, robust_accuracy, **params):
    return {"name": name, "status": "ok", "robust_accuracy": robust_accuracy,
            "params": {"norm": "linf", "steps": 10, **params, "eps": eps}}


def report_of(*sections, num_examples=1000, metrics=None):
    return {"attacks": list(sections), "metrics": metrics, "dataset": {"num_examples": num_examples}}


@pytest.mark.parametrize("curve", [(0.5, 0.5, 0.5), (0.6, 0.3, 0.0), (0.5, 0.52, 0.4)],
                         ids=["flat", "falling", "rise-within-noise"])
def test_robust_accuracy_that_does_not_rise_with_eps_passes(curve):
    report = report_of(*(section("pgd", eps, acc) for eps, acc in zip((0.1, 0.2, 0.3), curve)))
    assert sanity.accuracy_falls_with_eps(report)["verdict"] == "pass"


def test_robust_accuracy_that_rises_with_eps_is_flagged():
    report = report_of(section("pgd", 0.1, 0.3), section("pgd", 0.2, 0.2), section("pgd", 0.3, 0.45),
                       section("pgd", 0.1, 0.9, steps=1))
    check = sanity.accuracy_falls_with_eps(report)
    assert check["verdict"] == "warn"
    assert [(r["eps_low"], r["eps_high"]) for r in check["value"]["rises"]] == [(0.1, 0.3), (0.2, 0.3)]
    # Attacks with other parameters are other curves, and one epsilon is no curve.
    assert sanity.accuracy_falls_with_eps(report_of(section("pgd", 0.1, 0.3), section("pgd", 0.2, 0.5, steps=1))
                                          )["verdict"] == "skipped"


def test_a_warning_on_a_barely_trained_model_names_that_cause_first():
    warned = sanity.accuracy_falls_with_eps(report_of(section("pgd", 0.1, 0.3), section("pgd", 0.2, 0.45)))
    weak = sanity.weak_model_advice(warned, clean_accuracy=0.16, num_classes=10)
    assert weak["advice"].startswith("The model classifies only 16% of the examples correctly (chance: 10%)")
    assert weak["advice"].endswith(warned["advice"])
    # A trained model, a passed check, and a 1000-class model well above chance keep the check's own advice.
    assert sanity.weak_model_advice(warned, clean_accuracy=0.31, num_classes=10) == warned
    assert sanity.weak_model_advice({**warned, "verdict": "pass"}, 0.16, 10)["advice"] == warned["advice"]
    assert sanity.weak_model_advice(warned, clean_accuracy=0.16, num_classes=1000) == warned


def test_black_box_attacks_beating_white_box_ones_are_flagged():
    white = [section("pgd", 0.1, 0.40), section("apgd", 0.1, 0.38)]
    assert sanity.black_box_beats_white_box(report_of(*white, section("square", 0.1, 0.379)))["verdict"] == "pass"
    check = sanity.black_box_beats_white_box(report_of(*white, section("square", 0.1, 0.30)))
    assert check["verdict"] == "warn" and check["value"]["comparisons"][0]["white_box"] == "apgd"
    assert sanity.black_box_beats_white_box(report_of(*white, section("square", 0.2, 0.1)))["verdict"] == "skipped"


def test_transferred_examples_beating_the_white_box_attack_are_flagged():
    attack = {"name": "pgd", "norm": "linf", "eps": 0.1}
    metrics = {"status": "ok", "results": [
        {"name": "AAW", "status": "ok", "value": 0.5, "settings": {"attack": attack}},
        {"name": "AAB", "status": "ok", "value": 0.2, "settings": {"attack": attack, "source": "digits_mlp"}}]}
    assert sanity.black_box_beats_white_box(report_of(metrics=metrics))["verdict"] == "warn"
    metrics["results"][1]["value"] = 0.8
    assert sanity.black_box_beats_white_box(report_of(metrics=metrics))["verdict"] == "pass"


def test_attacks_are_told_apart_by_their_access_to_the_model():
    kinds = {name: sanity.attack_kind(name) for name in rj.attacks.names()}
    black = {"square", "spsa", "nes", "simba", "boundary", "hop_skip_jump", "sign_opt", "rays"}
    assert {name for name, kind in kinds.items() if kind == "black-box"} == black & set(kinds)
    assert kinds["pgd"] == kinds["apgd"] == kinds["fgsm"] == "white-box"


def test_the_plan_table_validates_and_defaults_to_enabled_in_evaluate():
    plan = plan_from_dict({})  # unset: robustjax evaluate runs the checks (a sweep does not)
    assert plan.sanity.enabled is None and plan.as_dict()["sanity"]["num_examples"] == SanityRun().num_examples
    assert plan_from_dict({"sanity": {"enabled": False, "num_examples": 16}}).as_dict()["sanity"]["enabled"] is False
    with pytest.raises(ValueError, match="did you mean 'num_examples'"):
        plan_from_dict({"sanity": {"num_exampels": 16}})
    with pytest.raises(ValueError, match="sanity.restarts must be >= 2"):
        plan_from_dict({"sanity": {"restarts": 1}})


def test_the_terminal_table_lists_the_warnings():
    checks = [sanity.black_box_beats_white_box(report_of(section("pgd", 0.1, 0.4), section("square", 0.1, 0.1))),
              sanity.skipped("unbounded_pgd", "no correctly classified example")]
    console = Console(width=200, record=True)
    console.print(sanity_table({"sanity": {"status": "ok", "checks": checks, "num_examples": 0}}))
    text = console.export_text()
    assert "black_box_beats_white_box" in text and "unbounded_pgd" not in text and "1 skipped" in text
    assert sanity_table({"sanity": None}) is None


def test_a_check_that_fails_is_skipped_with_its_error(setting, digits_clf):
    dataset, plan, parallel = setting
    undifferentiable = wrapped(digits_clf, "undifferentiable", lambda logits, x: jax.pure_callback(
        lambda images: np.asarray(images), jax.ShapeDtypeStruct((x.shape[0], 10), jnp.float32), logits(x)))
    probe = sanity.Probe(undifferentiable, *rj.data.digits("test").arrays(limit=8), parallel, plan.sanity, 0.2,
                         jax.random.key(0))
    check = sanity.run_check("input_gradients", probe)
    assert check["verdict"] == "skipped" and "Pure callbacks do not support JVP" in check["reason"]
    assert sanity.run_check("input_gradients", dataclasses.replace(probe, x=probe.x[:0], y=probe.y[:0]))["reason"] \
        == "no correctly classified example"
