"""AutoAttack's checks on every call (fra31/auto-attack ``checks.py``): each fires on the
broken model made for it, and none on the trained digits CNN."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import robustjax as rj
from robustjax.attacks import flags
from robustjax.evaluation import plan_from_dict
from tests.helpers import linear_classifier

SMALL = dict(eps=0.1, steps=3, target_classes=2, square_queries=20)


def _linear(num_classes=10, seed=0):
    rng = np.random.default_rng(seed)
    return linear_classifier(rng.normal(size=(64, num_classes)), np.zeros(num_classes), input_shape=(8, 8, 1))


def _batch(n=8, seed=1):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.uniform(size=(n, 8, 8, 1)), jnp.float32), jnp.asarray(rng.integers(0, 10, n), jnp.int32)


def _raised(attack, classifier, x, y) -> set[str]:
    """The names of the checks that warned on one call."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attack(classifier, x, y, key=jax.random.key(0))
    return {str(w.message).split(":")[0].removeprefix("AutoAttack check ") for w in caught
            if issubclass(w.category, flags.ModelCheckWarning)}


def _softmax(clf):
    return clf.replace(apply_fn=lambda params, x: jax.nn.softmax(clf.apply_fn(params, x)))


def _log_softmax(clf):
    return clf.replace(apply_fn=lambda params, x: jax.nn.log_softmax(clf.apply_fn(params, x)))


def _no_gradient(clf):
    return clf.replace(apply_fn=lambda params, x: clf.apply_fn(params, jax.lax.stop_gradient(x)))


def _batch_dependent(clf):
    """Normalises with the batch's own statistics, like batch norm left in training mode."""
    return clf.replace(apply_fn=lambda params, x: clf.apply_fn(params, x - x.mean(axis=0, keepdims=True)))


def _model_flags(clf, x, y) -> set[str]:
    return {flag.name for flag in flags.model_flags(clf, x, y) if flag.raised}


@pytest.mark.parametrize(("broken", "check"), [(_softmax, "probability_outputs"),
                                               (_log_softmax, "probability_outputs"),
                                               (_no_gradient, "input_gradients"),
                                               (_batch_dependent, "deterministic_forward")])
def test_each_model_check_fires_on_its_broken_model_and_only_there(broken, check):
    x, y = _batch()
    assert _model_flags(broken(_linear()), x, y) == {check}
    with pytest.raises(flags.ModelCheckError, match=check):  # before the attack runs
        rj.attacks.AutoAttack(**SMALL, checks="raise")(broken(_linear()), x, y, key=jax.random.key(0))


def test_checks_warn_by_default_on_every_call_and_not_when_off():
    x, y = _batch()
    assert not _model_flags(_linear(), x, y)
    assert _raised(rj.attacks.AutoAttack(**SMALL), _softmax(_linear()), x, y) == {"probability_outputs"}
    assert not _raised(rj.attacks.AutoAttack(**SMALL, checks="off"), _softmax(_linear()), x, y)


def test_the_class_count_check_names_what_is_left_out_also_inside_jit():
    x, y = _batch()
    three = _linear(num_classes=3)
    y = y % 3
    assert _raised(rj.attacks.AutoAttack(**SMALL), three, x, y) == {"class_count"}  # 2 targets fit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.jit(lambda x, y: rj.attacks.AutoAttack(**{**SMALL, "target_classes": 9})(
            three, x, y, key=jax.random.key(0)).success)(x, y)
    messages = [str(w.message) for w in caught if issubclass(w.category, flags.ModelCheckWarning)]
    assert any("class_count" in m and "APGD-T is left out" in m for m in messages)
    assert any("target_classes" in m and "9 target classes asked" in m and ": 2 used" in m for m in messages)
    assert any("APGD-DLR and APGD-T are left out" in f.message for f in flags.class_count(2, 1, version="plus"))
    assert not flags.class_count(4, 3, version="plus")


def test_square_beating_the_white_box_components_is_flagged():
    # Without input gradients the white-box components fool nothing; Square, needing none,
    # fools a linear model at a large eps.
    x, y = _batch(16)
    clf = _no_gradient(_linear())
    y = jnp.argmax(clf(x), -1)  # all correctly classified
    attack = rj.attacks.AutoAttack(eps=0.5, steps=2, target_classes=1, square_queries=50)
    assert "square_beats_white_box" in _raised(attack, clf, x, y)
    assert "square_beats_white_box" not in _raised(attack, _linear(), x, jnp.argmax(_linear()(x), -1))


@pytest.mark.parametrize(("fooled", "examples", "raised"), [(2, 1000, False), (3, 1000, True), (1, 500, False),
                                                          (2, 500, True), (0, 100, False), (1, 100, True)])
def test_square_tolerance_is_two_per_mille_of_the_examples(fooled, examples, raised):
    """Raised when Square lowers robust accuracy by more than 0.2 points (the original's
    ``acc_square < acc - 0.002``), just inside and just outside."""
    assert flags.square_beats_white_box(fooled, examples).raised is raised


def test_the_trained_digits_cnn_raises_no_check(digits_clf, digits_batch):
    x, y = digits_batch
    assert not _raised(rj.attacks.AutoAttack(**SMALL), digits_clf, x[:16], y[:16])


def test_a_bad_checks_value_is_refused_by_name():
    with pytest.raises(ValueError, match="checks"):
        rj.attacks.AutoAttack(checks="loud")


def test_evaluate_plans_leave_the_checks_to_the_sanity_section():
    plan = plan_from_dict({"attacks": [{"name": "autoattack", "eps": 0.1, "steps": 2}]})
    assert plan.runs[0].attack.checks == "off"
    plan = plan_from_dict({"attacks": [{"name": "autoattack", "eps": 0.1, "checks": "raise"}]})
    assert plan.runs[0].attack.checks == "raise"
