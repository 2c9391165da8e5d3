"""Every streaming accumulator of ``robustjax.metrics`` follows one protocol
(``robustjax.metrics.accumulator``): discovered, not listed, so a new one cannot escape.

Per accumulator, on three tiny batches: ``update`` in ``lax.scan`` equals one ``update`` on
the concatenated data (and the one-shot function); ``update`` then ``merge`` equals two
``update`` calls, with the empty accumulator's structure, shapes and dtypes; ``compute``
returns metric names of ``metrics.DIRECTIONS``; counts are int32; ``jax.vmap`` gives one
accumulator per network.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
import typing
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest

import robustjax as rj
from robustjax import metrics
from robustjax.evaluation import runner
from robustjax.metrics import behaviour as bh
from robustjax.metrics import calibration as cal
from robustjax.metrics import coverage as cov
from robustjax.metrics import imperceptibility as im
from robustjax.metrics import robustart as ra
from robustjax.metrics import structure as st

BATCH, BATCHES = 4, 3
WIDTHS = {"a": 3, "b": 2}


def _batch(seed: int) -> dict:
    """Every kind of input an accumulator takes, for one batch of BATCH examples."""
    rng = np.random.default_rng(seed)
    f32 = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    x = jnp.asarray(rng.uniform(0.1, 0.9, (BATCH, 8, 8, 1)), jnp.float32)
    features = {"conv": f32(BATCH, 2, 2, 2), "fc": f32(BATCH, 3)}
    confidence = jnp.asarray(rng.uniform(0.3, 1.0, BATCH), jnp.float32)
    logits = 2 * f32(BATCH, 3)
    predicted = jnp.argmax(logits, -1)
    # Example 0 is right and example 3 wrong on both models; 1 and 2 are random: every
    # success set and comparison set is non-empty in every batch.
    labels = jnp.asarray(rng.integers(0, 3, BATCH), jnp.int32).at[0].set(predicted[0]).at[3].set((predicted[3] + 1) % 3)
    other = (2 * f32(BATCH, 3)).at[0].set(1.5 * logits[0]).at[3].set(1.5 * logits[3])
    return {
        "logits": logits, "other": other, "labels": labels,
        "x": x, "x_adv": jnp.clip(x + 0.05 * jnp.sign(f32(*x.shape)), 0, 1),
        "success": jnp.array([True, False, True, True]),
        "values": {name: f32(BATCH, width) for name, width in WIDTHS.items()},
        "features": features, "features_noisy": jax.tree.map(lambda a: a + 0.1 * f32(*a.shape), features),
        "distances": jnp.asarray(rng.uniform(0, 0.5, BATCH), jnp.float32),
        "steps": jnp.asarray(rng.integers(1, 10, BATCH), jnp.int32), "capped": jnp.array([False, True, False, False]),
        "confidence": confidence, "correct": confidence > 0.65,  # calibration gaps of both signs
        "scores": f32(BATCH), "is_ood": jnp.array([True, False, True, False]),
        "clean_correct": jnp.array([True, True, True, False]),
        "adversarial_correct": jnp.asarray(rng.uniform(size=(BATCH, 2)) < 0.5),  # (B, attacks)
    }


BOUNDS = cov.NeuronBounds.empty(WIDTHS).update(_batch(99)["values"])


@dataclasses.dataclass(frozen=True)
class Case:
    """How to build an accumulator, what one batch passes to ``update``, and the one-shot
    functions (on all the data) its ``compute`` must equal."""

    empty: Callable[[], object]
    arguments: Callable[[dict], tuple]
    one_shot: Callable[..., dict] | None = None


def _logits(*names):
    return lambda d: tuple(d[n] for n in names)


ADVERSARIAL = _logits("logits", "labels")
PAIR = _logits("other", "logits", "labels")
IMAGES = _logits("x", "x_adv", "success")
CASES: dict[type, Case] = {
    bh.Accuracy: Case(bh.Accuracy.empty, ADVERSARIAL, lambda z, y: {"accuracy": bh.accuracy(z, y)}),
    bh.AttackSuccessRate: Case(bh.AttackSuccessRate.empty, ADVERSARIAL, lambda z, y: {"asr": bh.attack_success_rate(z, y)}),
    bh.AdversarialClassConfidence: Case(bh.AdversarialClassConfidence.empty, ADVERSARIAL,
                                        lambda z, y: {"acac": bh.average_confidence_adversarial_class(z, y)}),
    bh.TrueClassConfidence: Case(bh.TrueClassConfidence.empty, ADVERSARIAL,
                                 lambda z, y: {"actc": bh.average_confidence_true_class(z, y)}),
    bh.NoiseToleranceEstimation: Case(bh.NoiseToleranceEstimation.empty, ADVERSARIAL,
                                      lambda z, y: {"nte": bh.noise_tolerance_estimation(z, y)}),
    bh.TransformSurvival: Case(lambda: bh.TransformSurvival.empty(toolkit_compat=True), _logits("logits", "other", "labels"),
                               lambda a, t, y: {"transform_survival": bh.robustness_to_gaussian_blur(a, t, y, toolkit_compat=True)}),
    bh.AccuracyVariation: Case(bh.AccuracyVariation.empty, PAIR, lambda *a: {"cav": bh.classification_accuracy_variance(*a)}),
    bh.RectifyRatio: Case(bh.RectifyRatio.empty, PAIR, lambda *a: {"crr": bh.classification_rectify_ratio(*a)}),
    bh.SacrificeRatio: Case(bh.SacrificeRatio.empty, PAIR, lambda *a: {"csr": bh.classification_sacrifice_ratio(*a)}),
    bh.ConfidenceVariance: Case(bh.ConfidenceVariance.empty, PAIR, lambda *a: {"ccv": bh.classification_confidence_variance(*a)}),
    bh.OutputStability: Case(lambda: bh.OutputStability.empty(toolkit_compat=True), PAIR,
                             lambda *a: {"cos": bh.classification_output_stability(*a, toolkit_compat=True)}),
    im.AverageLpDistortion: Case(im.AverageLpDistortion.empty, IMAGES,
                                 lambda *a: dict(zip(("ald_0", "ald_2", "ald_inf"), im.average_lp_distortion(*a)))),
    im.AverageStructuralSimilarity: Case(lambda: im.AverageStructuralSimilarity.empty(window=7), IMAGES,
                                         lambda *a: {"ass": im.average_structural_similarity(*a, window=7)}),
    im.PerturbationSensitivityDistance: Case(im.PerturbationSensitivityDistance.empty, IMAGES,
                                             lambda *a: {"psd": im.average_perturbation_sensitivity_distance(*a)}),
    cov.NeuronBounds: Case(lambda: cov.NeuronBounds.empty(WIDTHS), _logits("values")),
    cov.KMultisectionCoverage: Case(lambda: cov.KMultisectionCoverage.empty(BOUNDS, 4), _logits("values"),
                                    lambda v: {"kmnc": cov.kmnc(v, BOUNDS, 4)}),
    cov.BoundaryCoverage: Case(lambda: cov.BoundaryCoverage.empty(BOUNDS), _logits("values"),
                               lambda v: {"nbc": cov.nbc(v, BOUNDS), "snac": cov.snac(v, BOUNDS)}),
    cov.TopKCoverage: Case(lambda: cov.TopKCoverage.empty(WIDTHS, 2), _logits("values"), lambda v: {"tknc": cov.tknc(v, 2)}),
    cov.TopKPatterns: Case(lambda: cov.TopKPatterns.empty(WIDTHS, 1, capacity=16), _logits("values"),
                           lambda v: {"tknp": cov.tknp(v, 1)}),
    cal.CalibrationStats: Case(lambda: cal.CalibrationStats.empty(16, beta=4, num_bins=5), _logits("confidence", "correct"),
                               lambda c, k: {"rms_calibration_error": cal.rms_calibration_error(c, k, beta=4),
                                             "expected_calibration_error": cal.expected_calibration_error(c, k, num_bins=5),
                                             "aurra": cal.aurra(c, k), "accuracy": jnp.mean(k)}),
    cal.OODStats: Case(lambda: cal.OODStats.empty(16, tpr=0.5), _logits("scores", "is_ood"),
                       lambda s, o: {"auroc": cal.auroc(s, o), "aupr": cal.average_precision(s, o),
                                     "fpr_at_tpr": cal.fpr_at_tpr(s, o, tpr=0.5)}),
    ra.AdversarialRobustnessStats: Case(lambda: ra.AdversarialRobustnessStats.empty(2),
                                        lambda d: (d["clean_correct"], d["adversarial_correct"].T),
                                        lambda c, a: {"clean_accuracy": jnp.mean(c),
                                                      "adversarial_robustness": ra.adversarial_robustness(c, a),
                                                      "worst_case_adversarial_robustness": ra.worst_case_adversarial_robustness(c, a)}),
    st.BoundaryDistanceStats: Case(st.BoundaryDistanceStats.empty, _logits("distances"), lambda d: {"ebd": jnp.mean(d)}),
    st.BoundaryStepStats: Case(st.BoundaryStepStats.empty, _logits("steps", "capped")),
    st.NoiseInsensitivityStats: Case(st.NoiseInsensitivityStats.empty, _logits("x", "x_adv", "logits", "other", "labels"),
                                     lambda *a: {"eni": st.empirical_noise_insensitivity(*a)}),
    st.NeuronSensitivityStats: Case(lambda: st.NeuronSensitivityStats.empty({"conv": 2, "fc": 3}),
                                    _logits("features", "features_noisy"),
                                    lambda f, g: {"neuron_sensitivity": st.mean_over_neurons(st.neuron_sensitivity(f, g))}),
    st.NeuronUncertaintyStats: Case(lambda: st.NeuronUncertaintyStats.empty(WIDTHS), _logits("values"),
                                    lambda v: {"neuron_uncertainty": st.mean_over_neurons(st.neuron_uncertainty(v))}),
}
# Streams like an accumulator, but is an input of the coverage accumulators, not a metric.
PROFILES = {cov.NeuronBounds}


def _streaming_classes() -> set[type]:
    """Every dataclass with an ``update`` defined in a module of robustjax.metrics."""
    found = set()
    for module_info in pkgutil.iter_modules(metrics.__path__):
        module = importlib.import_module(f"{metrics.__name__}.{module_info.name}")
        found |= {value for value in vars(module).values()
                  if isinstance(value, type) and value.__module__ == module.__name__
                  and dataclasses.is_dataclass(value) and hasattr(value, "update")}
    return found


def test_every_streaming_class_is_covered_and_follows_the_protocol():
    found = _streaming_classes()
    assert found == set(CASES), f"without a case here: {sorted(c.__name__ for c in found - set(CASES))}"
    for cls in found:
        assert issubclass(cls, metrics.Accumulator) == (cls not in PROFILES), cls.__name__


def _close(a, b, err_msg=""):
    """Same tree structure, leaves equal to float32 rounding of differently ordered sums."""
    assert jax.tree.structure(a) == jax.tree.structure(b), err_msg
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6, err_msg=err_msg)


def _same_layout(acc, like, name: str):
    assert jax.tree.structure(acc) == jax.tree.structure(like), name
    assert [(leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(acc)] == [
        (leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(like)], name


def _integer_fields(cls) -> list[str]:
    """Fields annotated as integer arrays (jaxtyping ``Int``), alone or as dict values."""
    fields = []
    for name, hint in typing.get_type_hints(cls).items():
        inner = typing.get_args(hint)[-1] if typing.get_origin(hint) is dict else hint
        if getattr(inner, "dtype", None) is jaxtyping.Int:
            fields.append(name)
    return fields


@pytest.mark.parametrize("cls", list(CASES), ids=lambda cls: cls.__name__)
def test_accumulator_protocol(cls):
    case = CASES[cls]
    empty = case.empty()
    raw = [_batch(seed) for seed in range(BATCHES)]
    batches = [case.arguments(batch) for batch in raw]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *batches)
    together = case.arguments(jax.tree.map(lambda *a: jnp.concatenate(a), *raw))
    metric = cls not in PROFILES

    @jax.jit
    def variants(empty, batches, stacked, together):
        """Everything compared below, in one compiled program (one compile per case)."""
        scanned, _ = jax.lax.scan(lambda acc, batch: (acc.update(*batch), None), empty, stacked)
        merged = empty.update(*batches[0]).merge(empty.update(*batches[1]))
        streamed = empty.update(*batches[0]).update(*batches[1])
        alone = [empty.update(*batch) for batch in batches]
        networks = jax.vmap(lambda *batch: empty.update(*batch))(*stacked)  # one network per batch
        if not metric:
            return scanned, empty.update(*together), merged, streamed, alone, networks, None, None
        computed = jax.vmap(lambda acc: acc.compute())(networks), [acc.compute() for acc in alone]
        return scanned, empty.update(*together), merged, streamed, alone, networks, *computed

    scanned, whole, merged, streamed, alone, networks, computed, computed_alone = variants(
        empty, batches, stacked, together)
    # (a) scanned = one update on everything (= the one-shot functions); (b) merge = update.
    _close(scanned, whole, "scan")
    _close(merged, streamed, "merge")
    for name, acc in {"update": whole, "scan": scanned, "merge": merged}.items():
        _same_layout(acc, empty, name)
    # (d) counts are int32, sums of floats float32.
    assert whole.count.dtype == jnp.int32 and "count" in _integer_fields(cls)
    for name in _integer_fields(cls):
        assert {leaf.dtype for leaf in jax.tree.leaves(getattr(whole, name))} == {jnp.dtype(jnp.int32)}, name
    assert {leaf.dtype for leaf in jax.tree.leaves(whole)} <= {jnp.dtype(t) for t in (jnp.int32, jnp.float32, bool)}
    # (e) under vmap, each network's accumulator (and result) is the one it gets alone.
    for index in range(BATCHES):
        _close(jax.tree.map(lambda leaf: leaf[index], networks), alone[index], f"network {index}")
    if not metric:
        return
    for index in range(BATCHES):
        _close(jax.tree.map(lambda leaf: leaf[index], computed), computed_alone[index], f"network {index}")
    # (c) compute, on concrete values: metric names with a direction.
    results = whole.compute()
    assert isinstance(results, dict) and set(results) <= set(metrics.DIRECTIONS), set(results) - set(metrics.DIRECTIONS)
    assert all(isinstance(value, jax.Array) for value in results.values())
    if case.one_shot is not None:
        _close(results, case.one_shot(*together), "one-shot")


def test_merge_refuses_other_settings_and_sizes():
    with pytest.raises(TypeError, match="cannot merge Accuracy with RectifyRatio"):
        bh.Accuracy.empty().merge(bh.RectifyRatio.empty())
    with pytest.raises(ValueError, match="different settings"):
        cov.TopKCoverage.empty(WIDTHS, 2).merge(cov.TopKCoverage.empty(WIDTHS, 3))
    with pytest.raises(ValueError, match="different sizes"):
        ra.AdversarialRobustnessStats.empty(1).merge(ra.AdversarialRobustnessStats.empty(2))


def test_buffer_overflow_by_merging_is_refused():
    half = cal.OODStats.empty(4).update(jnp.array([0.1, 0.9, 0.3]), jnp.array([False, True, True]))
    merged = half.merge(half)
    _same_layout(merged, half, "merge")
    assert int(merged.count) == 6
    with pytest.raises(ValueError, match="overflowed: 6 samples seen, capacity 4"):
        merged.compute()
    assert np.isnan(jax.jit(lambda acc: acc.compute())(merged)["auroc"])


# --------------------------------------------------------------------------- WCAR streamed


# Nine examples, the last misclassified clean. Attack A fools 0 and 1, B fools 2, C none:
# no single attack fools every example another one fools.
CLEAN = np.array([True] * 8 + [False])
FOOLED = {"A": {0, 1}, "B": {2}, "C": set()}
ADVERSARIAL_CORRECT = np.array([[i not in fooled and CLEAN[i] for i in range(9)] for fooled in FOOLED.values()])


def test_streamed_wcar_is_the_worst_case_per_example():
    # By hand: 8 clean-correct examples, 3 of them fooled by some attack.
    wcar, worst_attack = 5 / 8, min(1 - len(f) / 8 for f in FOOLED.values())
    assert worst_attack != wcar  # the minimum over attacks of each one's AR (6/8) is not WCAR

    def step(acc, batch):
        return acc.update(*batch), None

    batches = (CLEAN.reshape(3, 3), ADVERSARIAL_CORRECT.reshape(3, 3, 3).transpose(1, 0, 2))  # 3 batches of 3
    stats, _ = jax.lax.scan(step, ra.AdversarialRobustnessStats.empty(3), batches)
    streamed = float(stats.compute()["worst_case_adversarial_robustness"])
    assert streamed == pytest.approx(wcar, rel=1e-6)
    assert float(ra.worst_case_adversarial_robustness(CLEAN, ADVERSARIAL_CORRECT)) == pytest.approx(wcar, rel=1e-6)
    # The runner's worst-case section over the three attacks at one budget.
    sections = [({"name": name, "params": {"norm": "linf", "eps": 0.1}}, mask)
                for name, mask in zip(FOOLED, ADVERSARIAL_CORRECT)]
    (entry,) = runner.worst_case_section(sections, CLEAN)
    assert entry["attacks"] == ["A", "B", "C"]
    assert entry["wcar"] == wcar and entry["robust_accuracy"] == 5 / 9


# --------------------------------------------------------------------------- README


def _readme_metrics_example() -> str:
    """The Python block of README.md's "Metrics" section."""
    text = (Path(__file__).parents[1] / "README.md").read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


def test_the_readme_scan_example_runs_and_equals_the_one_shot_functions():
    namespace: dict = {}
    exec(_readme_metrics_example(), namespace)  # noqa: S102 - the README's own example
    logits, labels, results = namespace["logits"], namespace["labels"], namespace["results"]
    flat_logits, flat_labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    assert float(results["accuracy"]) == pytest.approx(float(bh.accuracy(flat_logits, flat_labels)))
    confidence, correct = cal.max_softmax(flat_logits), jnp.argmax(flat_logits, -1) == flat_labels
    assert float(results["expected_calibration_error"]) == pytest.approx(
        float(cal.expected_calibration_error(confidence, correct, num_bins=10)), rel=1e-6)
    assert float(results["aurra"]) == pytest.approx(float(cal.aurra(confidence, correct)), rel=1e-6)
    assert namespace["directions"]["expected_calibration_error"] == "lower"
    assert rj.metrics.DIRECTIONS is metrics.DIRECTIONS
