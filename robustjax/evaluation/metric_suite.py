"""The report section of the 23 metrics of "A Comprehensive Evaluation Framework for Deep
Model Robustness" (Guo, Liu et al., arXiv 2101.09617), grouped as the paper groups them
(data: neuron coverage, imperceptibility; model: behaviour, structure), followed by the
attack success rate and DEEPSEC's defence-comparison metrics (the model under test against
the plan's reference model).

One pass over the evaluated set streams every accumulator of :mod:`robustjax.metrics`:
per batch the plan's attack runs on the model (white-box examples) and on the reference
(transferred examples), EBD and EBD-2 probe the clean images, and a jitted update folds the
batch's real (not padding) examples into the accumulators. Neuron bounds are profiled
first, over the whole profiling set; the corruption errors of mCE come last. A metric that
is undefined on the data (no successful adversarial example, say) or cannot be computed is
reported with its reason and no value, never as a silent 0 or NaN.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from robustjax import metrics, noise
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset
from robustjax.distributed import to_host
from robustjax.evaluation.parallel import predict
from robustjax.evaluation.plan import BASELINES, MetricsRun, Plan
from robustjax.evaluation.progress import UNTRACKED, Step
from robustjax.evaluation.timing import timed
from robustjax.metrics import behaviour, coverage, imperceptibility, structure

COVERAGE = "data: neuron coverage"
IMPERCEPTIBILITY = "data: imperceptibility"
BEHAVIOUR = "model: behaviour"
STRUCTURE = "model: structure"
ADDITIONAL = "additional: attack success and defence comparison"
GROUPS = (COVERAGE, IMPERCEPTIBILITY, BEHAVIOUR, STRUCTURE, ADDITIONAL)
_ADEQUACY = "of the adversarial examples (test adequacy)"


@dataclasses.dataclass(frozen=True)
class MetricInfo:
    """A report entry's identity: ``index`` is the metric's number among the paper's 23;
    ``source`` names the accumulator of the streamed state it comes from (None for mCE)
    and ``key`` its name among that accumulator's results (and in ``metrics.DIRECTIONS``)."""

    name: str
    group: str
    index: int | None
    source: str | None
    key: str
    description: str

    @property
    def direction(self) -> str:
        return metrics.DIRECTIONS[self.key]


CATALOGUE = (
    MetricInfo("KMNC", COVERAGE, 1, "KMNC", "kmnc", f"k-multisection neuron coverage {_ADEQUACY}"),
    MetricInfo("NBC", COVERAGE, 2, "NBC", "nbc", f"neuron boundary coverage {_ADEQUACY}"),
    MetricInfo("SNAC", COVERAGE, 3, "NBC", "snac", f"strong neuron activation coverage {_ADEQUACY}"),
    MetricInfo("TKNC", COVERAGE, 4, "TKNC", "tknc", f"top-k neuron coverage {_ADEQUACY}"),
    MetricInfo("TKNP", COVERAGE, 5, "TKNP", "tknp", f"distinct top-k neuron patterns {_ADEQUACY}"),
    MetricInfo("ALD_0", IMPERCEPTIBILITY, 6, "ALD", "ald_0", "average L0 distortion of successful examples"),
    MetricInfo("ALD_2", IMPERCEPTIBILITY, 6, "ALD", "ald_2", "average relative L2 distortion"),
    MetricInfo("ALD_inf", IMPERCEPTIBILITY, 6, "ALD", "ald_inf", "average relative Linf distortion"),
    MetricInfo("ASS", IMPERCEPTIBILITY, 7, "ASS", "ass", "average structural similarity (SSIM)"),
    MetricInfo("PSD", IMPERCEPTIBILITY, 8, "PSD", "psd", "perturbation sensitivity distance"),
    MetricInfo("CA", BEHAVIOUR, 9, "CA", "accuracy", "clean accuracy"),
    MetricInfo("AAW", BEHAVIOUR, 10, "AAW", "accuracy", "accuracy under the white-box attack"),
    MetricInfo("AAB", BEHAVIOUR, 11, "AAB", "accuracy", "accuracy under examples transferred from the reference"),
    MetricInfo("ACAC", BEHAVIOUR, 12, "ACAC", "acac", "average confidence of the adversarial class"),
    MetricInfo("ACTC", BEHAVIOUR, 13, "ACTC", "actc", "average confidence of the true class"),
    MetricInfo("NTE", BEHAVIOUR, 14, "NTE", "nte", "noise tolerance estimation (top-1 minus top-2 probability)"),
    MetricInfo("RGB", BEHAVIOUR, 15, "RGB", "transform_survival",
               "share of adversarial examples surviving a Gaussian blur"),
    MetricInfo("RIC", BEHAVIOUR, 16, "RIC", "transform_survival",
               "share of adversarial examples surviving JPEG compression"),
    MetricInfo("mCE", BEHAVIOUR, 17, None, "corruption_error", "mean corruption error, normalised by the baseline"),
    MetricInfo("relative_mCE", BEHAVIOUR, 18, None, "relative_corruption_error",
               "relative mean corruption error (degradation from clean)"),
    MetricInfo("EBD", STRUCTURE, 19, "EBD", "ebd", "empirical boundary distance along random directions"),
    MetricInfo("EBD-2", STRUCTURE, 20, "EBD-2", "ebd2", "sign-gradient steps to the decision boundary"),
    MetricInfo("ENI", STRUCTURE, 21, "ENI", "eni", "empirical noise insensitivity (loss change per Linf)"),
    MetricInfo("NS", STRUCTURE, 22, "NS", "neuron_sensitivity", "neuron sensitivity, mean over neurons"),
    MetricInfo("NU", STRUCTURE, 23, "NU", "neuron_uncertainty", "neuron uncertainty (variance), mean over neurons"),
    MetricInfo("ASR", ADDITIONAL, None, "ASR", "asr", "attack success rate over all examples"),
    MetricInfo("CAV", ADDITIONAL, None, "CAV", "cav", "clean accuracy of the model minus the reference's"),
    MetricInfo("CRR", ADDITIONAL, None, "CRR", "crr", "share the reference gets wrong and the model right"),
    MetricInfo("CSR", ADDITIONAL, None, "CSR", "csr", "share the reference gets right and the model wrong"),
    MetricInfo("CCV", ADDITIONAL, None, "CCV", "ccv", "true-class confidence change against the reference"),
    MetricInfo("COS", ADDITIONAL, None, "COS", "cos", "Jensen-Shannon divergence from the reference's output"),
)
_NEEDS_REFERENCE = {"AAB", "CAV", "CRR", "CSR", "CCV", "COS"}
_BOUNDED = {"KMNC", "NBC", "SNAC"}
_CORRUPTION = {"mCE", "relative_mCE"}
# Streams of the plan's seed for this section's randomness (attacks and EBD; corruptions).
_STREAM, _CORRUPTION_STREAM = 23, 24


@dataclasses.dataclass(frozen=True)
class _Static:
    """The settings the jitted update is specialised on (the accumulators' own settings
    are static parts of the state)."""

    layers: tuple[str, ...]
    conv_neuron: str
    rgb_sigma: float
    ric_quality: int
    has_reference: bool
    has_bounds: bool


@functools.partial(jax.jit, static_argnums=(0, 1))
def _profile(layers: tuple[str, ...], conv_neuron: str, bounds: coverage.NeuronBounds, classifier: Classifier, x):
    return bounds.update(coverage.neuron_values(classifier.features(x), layers, conv_neuron=conv_neuron))


def _empty_state(run: MetricsRun, static: _Static, widths: dict[str, int], bounds: coverage.NeuronBounds | None,
                 ssim_window: int) -> dict:
    compat = {"toolkit_compat": run.toolkit_compat}
    state = {
        "CA": behaviour.Accuracy.empty(), "AAW": behaviour.Accuracy.empty(), "AAB": behaviour.Accuracy.empty(),
        "ASR": behaviour.AttackSuccessRate.empty(), "ACAC": behaviour.AdversarialClassConfidence.empty(),
        "ACTC": behaviour.TrueClassConfidence.empty(), "NTE": behaviour.NoiseToleranceEstimation.empty(),
        "RGB": behaviour.TransformSurvival.empty(**compat), "RIC": behaviour.TransformSurvival.empty(**compat),
        "ALD": imperceptibility.AverageLpDistortion.empty(l0_denominator=run.ald_l0_denominator, **compat),
        "ASS": imperceptibility.AverageStructuralSimilarity.empty(window=ssim_window, **compat),
        "PSD": imperceptibility.PerturbationSensitivityDistance.empty(**compat),
        "TKNC": coverage.TopKCoverage.empty(widths, run.tknc_k),
        "TKNP": coverage.TopKPatterns.empty(widths, run.tknp_k, run.tknp_capacity),
        "EBD": structure.BoundaryDistanceStats.empty(), "EBD-2": structure.BoundaryStepStats.empty(),
        "ENI": structure.NoiseInsensitivityStats.empty(**compat),
        "NS": structure.NeuronSensitivityStats.empty(widths, conv_neuron=run.conv_neuron),
        "NU": structure.NeuronUncertaintyStats.empty(widths),
    }
    if static.has_bounds:
        state["KMNC"] = coverage.KMultisectionCoverage.empty(bounds, run.kmnc_sections)
        state["NBC"] = coverage.BoundaryCoverage.empty(bounds)
    if static.has_reference:
        state.update(reference_accuracy=behaviour.Accuracy.empty(), CAV=behaviour.AccuracyVariation.empty(),
                     CRR=behaviour.RectifyRatio.empty(), CSR=behaviour.SacrificeRatio.empty(),
                     CCV=behaviour.ConfidenceVariance.empty(**compat), COS=behaviour.OutputStability.empty(**compat))
    return state


@functools.partial(jax.jit, static_argnums=0)
def _update(static: _Static, state: dict, classifier: Classifier, reference: Classifier | None,
            x, y, x_adv, x_transfer, distances, steps, capped):
    """Folds one batch of real examples into every accumulator."""
    logits, logits_adv = classifier(x), classifier(x_adv)
    features, features_adv = classifier.features(x), classifier.features(x_adv)
    values_adv = coverage.neuron_values(features_adv, static.layers, conv_neuron=static.conv_neuron)
    blurred = classifier(behaviour.blur_for_rgb(x_adv, static.rgb_sigma))
    compressed = classifier(behaviour.compress_for_ric(x_adv, static.ric_quality))
    new = dict(state)
    new.update(
        CA=state["CA"].update(logits, y), AAW=state["AAW"].update(logits_adv, y),
        ASR=state["ASR"].update(logits_adv, y), ACAC=state["ACAC"].update(logits_adv, y),
        ACTC=state["ACTC"].update(logits_adv, y), NTE=state["NTE"].update(logits_adv, y),
        RGB=state["RGB"].update(logits_adv, blurred, y), RIC=state["RIC"].update(logits_adv, compressed, y),
    )
    success = behaviour.attack_success(logits_adv, y)
    new.update(
        ALD=state["ALD"].update(x, x_adv, success), ASS=state["ASS"].update(x, x_adv, success),
        PSD=state["PSD"].update(x, x_adv, success),
        TKNC=state["TKNC"].update(values_adv), TKNP=state["TKNP"].update(values_adv),
        EBD=state["EBD"].update(distances), **{"EBD-2": state["EBD-2"].update(steps, capped)},
        ENI=state["ENI"].update(x, x_adv, logits, logits_adv, y),
        NS=state["NS"].update({n: features[n] for n in static.layers}, {n: features_adv[n] for n in static.layers}),
        NU=state["NU"].update(values_adv),
    )
    if static.has_bounds:
        new.update(KMNC=state["KMNC"].update(values_adv), NBC=state["NBC"].update(values_adv))
    if static.has_reference:
        reference_logits = reference(x)
        new.update(
            AAB=state["AAB"].update(classifier(x_transfer), y),
            reference_accuracy=state["reference_accuracy"].update(reference_logits, y),
            CAV=state["CAV"].update(logits, reference_logits, y), CRR=state["CRR"].update(logits, reference_logits, y),
            CSR=state["CSR"].update(logits, reference_logits, y), CCV=state["CCV"].update(logits, reference_logits, y),
            COS=state["COS"].update(logits, reference_logits, y),
        )
    return new


def _layer_widths(run: MetricsRun, classifier: Classifier) -> dict[str, int]:
    """The neurons' layers (the plan's, or every exposed layer but the logits) and widths."""
    probe = jax.ShapeDtypeStruct((1, *classifier.input_shape), jnp.float32)
    shapes = jax.eval_shape(
        lambda x: coverage.neuron_values(classifier.features(x), run.layers, conv_neuron=run.conv_neuron), probe)
    return {name: shape.shape[1] for name, shape in shapes.items()}


def _ssim_window(image_shape) -> int:
    """The SSIM window: 11 (Wang et al.), or the largest odd size that fits a smaller image."""
    side = min(image_shape[:2])
    return min(11, side if side % 2 else side - 1)


def _num_batches(examples: int, parallel) -> int:
    return -(-examples // parallel.batch_size)


def _real(mask: np.ndarray, *arrays):
    """The leading ``mask.sum()`` rows (the real examples; padding comes last) of each array,
    on the host: a device-sharded slice would split a few rows unevenly over the devices."""
    count = int(mask.sum())
    return [None if a is None else to_host(a)[:count] for a in arrays]


def _profile_bounds(run: MetricsRun, widths, classifier: Classifier, profile: ImageDataset, parallel, step: Step):
    """Per-neuron minimum and maximum over the whole profiling (training) set."""
    bounds = coverage.NeuronBounds.empty(widths)
    for x, _, mask in step.track(parallel.batches(profile, None)):
        (x,) = _real(mask, x)
        bounds = _profile(tuple(widths), run.conv_neuron, bounds, classifier, x)
    return bounds


def _corruption_errors(run: MetricsRun, models: dict[str, Classifier], dataset: ImageDataset, plan: Plan,
                       parallel, preset: str, key: jax.Array, step: Step) -> dict[str, np.ndarray]:
    """Top-1 error of each model per corruption and severity, (corruptions, severities);
    each batch is corrupted once and every model classifies the same corrupted images."""
    errors = {name: np.zeros((len(run.corruptions), len(run.severities))) for name in models}
    for c, corruption in enumerate(run.corruptions):
        for s, severity in enumerate(run.severities):
            wrong = dict.fromkeys(models, 0)
            count = 0
            for batch, (x, y, mask) in enumerate(step.track(parallel.batches(dataset, plan.num_examples))):
                batch_key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, c), severity), batch)
                corrupted = noise.corrupt(x, corruption, severity, batch_key, preset=preset)
                for name, model in models.items():
                    wrong[name] += int((to_host(predict(model, corrupted)) != to_host(y))[mask].sum())
                count += int(mask.sum())
            for name in models:
                errors[name][c, s] = wrong[name] / count
    return errors


def _baseline(run: MetricsRun, errors: dict[str, np.ndarray], reference_clean_error: float | None):
    """The baseline's errors (corruptions, severities) and clean error: the reference model
    on the same corrupted images, or a published table (AlexNet on ImageNet-C)."""
    if run.mce_baseline == "reference":
        return errors["reference"], reference_clean_error
    table = BASELINES[run.mce_baseline]
    return np.array([[table[name][s - 1] for s in run.severities] for name in run.corruptions]), metrics.ALEXNET_CLEAN_ERROR


def _mean_ce(run: MetricsRun, errors, baseline) -> float:
    if flat := [name for name, total in zip(run.corruptions, baseline.sum(axis=1)) if total <= 0]:
        raise ValueError(f"the baseline makes no error under {flat}, so CE is undefined")
    return float(np.mean(metrics.corruption_error(errors, baseline)))


def _mean_relative_ce(run: MetricsRun, errors, clean_error: float, baseline, baseline_clean: float) -> float:
    degradation = (baseline - baseline_clean).sum(axis=1)
    if flat := [name for name, d in zip(run.corruptions, degradation) if d <= 0]:
        raise ValueError(f"the baseline's error under {flat} does not exceed its clean error, so relative CE is undefined")
    return float(np.mean(metrics.relative_corruption_error(errors, clean_error, baseline, baseline_clean)))


def _settings(run: MetricsRun, layers: dict[str, int], profile: ImageDataset | None, reference: Classifier | None,
              ebd_directions: int, ssim_window: int, preset: str) -> dict[str, dict]:
    """Each metric's settings, as the report shows them next to its value."""
    attack = {"name": run.attack.name, **run.attack.params()}
    neurons = {"layers": list(layers), "neurons": sum(layers.values()), "conv_neuron": run.conv_neuron,
               "inputs": "adversarial examples"}
    bounds = {"bounds_profiled_on": None if profile is None else profile.name}
    over_success = {"over": "successful adversarial examples", "toolkit_compat": run.toolkit_compat}
    corruptions = {"baseline": run.reference if run.mce_baseline == "reference" else run.mce_baseline,
                   "corruptions": list(run.corruptions), "severities": list(run.severities), "preset": preset}
    comparison = {"reference": None if reference is None else reference.name, "inputs": "clean examples"}
    return {
        "KMNC": {**neurons, **bounds, "k": run.kmnc_sections}, "NBC": {**neurons, **bounds},
        "SNAC": {**neurons, **bounds}, "TKNC": {**neurons, "k": run.tknc_k}, "TKNP": {**neurons, "k": run.tknp_k},
        "ALD_0": {**over_success, "l0_denominator": imperceptibility.resolve_l0_denominator(
            run.ald_l0_denominator, run.toolkit_compat)},
        "ALD_2": over_success, "ALD_inf": over_success,
        "ASS": {**over_success, "window": ssim_window}, "PSD": {**over_success, "eps": imperceptibility.PSD_EPS},
        "CA": {}, "AAW": {"attack": attack},
        "AAB": {"attack": attack, "source": None if reference is None else reference.name},
        "ACAC": {"attack": attack}, "ACTC": {"attack": attack}, "NTE": {"attack": attack},
        "RGB": {"attack": attack, "sigma": run.rgb_sigma, "toolkit_compat": run.toolkit_compat},
        "RIC": {"attack": attack, "quality": run.ric_quality, "toolkit_compat": run.toolkit_compat},
        "mCE": corruptions, "relative_mCE": corruptions,
        "EBD": {"inputs": "clean examples", "directions": ebd_directions,
                "magnitudes": "0, 2, ..., 126 / 255 (first flip per direction, minimum over directions)"},
        "EBD-2": {"inputs": "clean examples", "step": run.ebd2_step, "max_steps": run.ebd2_max_steps,
                  "capped": "dropped from the mean"},
        "ENI": {"noise": "adversarial examples", "toolkit_compat": run.toolkit_compat},
        "NS": {**neurons, "inputs": "clean and adversarial examples"}, "NU": neurons,
        "ASR": {"attack": attack}, "CAV": comparison, "CRR": comparison, "CSR": comparison,
        "CCV": {**comparison, "toolkit_compat": run.toolkit_compat},
        "COS": {**comparison, "toolkit_compat": run.toolkit_compat},
    }


def _values(run: MetricsRun, state: dict, errors: dict[str, np.ndarray] | None) -> dict[str, Callable[[], float]]:
    """How each metric's value comes from the accumulators; each raises ValueError with
    the reason when the metric is undefined on the data."""
    values = {info.name: (lambda info=info: state[info.source].compute()[info.key])
              for info in CATALOGUE if info.source in state}
    if errors is not None:
        clean_error = 1.0 - float(state["CA"].compute()["accuracy"])
        reference_clean = (1.0 - float(state["reference_accuracy"].compute()["accuracy"])
                           if "reference_accuracy" in state else None)
        baseline, baseline_clean = _baseline(run, errors, reference_clean)
        values["mCE"] = lambda: _mean_ce(run, errors["model"], baseline)
        values["relative_mCE"] = lambda: _mean_relative_ce(run, errors["model"], clean_error, baseline, baseline_clean)
    return values


def _entries(settings: dict, values: dict[str, Callable[[], float]], problems: dict[str, tuple[str, str]]) -> list[dict]:
    """The report entries, in the paper's order; a metric without a value says why."""
    entries = []
    for info in CATALOGUE:
        entry = {"name": info.name, "group": info.group, "index": info.index, "direction": info.direction,
                 "description": info.description, "settings": settings[info.name]}
        if info.name in problems:
            entry.update(value=None, status=problems[info.name][0], reason=problems[info.name][1])
        else:
            try:
                value = float(values[info.name]())
            except ValueError as error:
                entry.update(value=None, status="undefined", reason=str(error))
            else:
                if math.isfinite(value):
                    entry.update(value=value, status="ok")
                else:
                    entry.update(value=None, status="failed", reason=f"the value is {value}: the model's outputs "
                                 "or activations are not finite on these examples")
        entries.append(entry)
    return entries


def _stream(run: MetricsRun, static: _Static, state: dict, classifier: Classifier, reference: Classifier | None,
            dataset: ImageDataset, plan: Plan, parallel, ebd_directions: int, step: Step) -> tuple[dict, int]:
    """One pass over the evaluated set: attacks, boundary probes and the accumulators."""
    stream_key, ebd_key = jax.random.split(jax.random.fold_in(jax.random.key(plan.seed), _STREAM), 2)
    count = 0
    for index, (x, y, mask) in enumerate(step.track(parallel.batches(dataset, plan.num_examples))):
        batch_key = jax.random.fold_in(stream_key, index)
        x_adv = run.attack(classifier, x, y, key=jax.random.fold_in(batch_key, 0)).x_adv
        x_transfer = None if reference is None else run.attack(reference, x, y, key=jax.random.fold_in(batch_key, 1)).x_adv
        distances = structure.boundary_distances(classifier, x, y, key=ebd_key, num_directions=ebd_directions)
        steps, capped = structure.boundary_steps(classifier, x, y, step_size=run.ebd2_step, max_steps=run.ebd2_max_steps)
        state = _update(static, state, classifier, reference, *_real(mask, x, y, x_adv, x_transfer, distances, steps, capped))
        count += int(mask.sum())
    return state, count


def metrics_section(
    run: MetricsRun, classifier: Classifier, dataset: ImageDataset, plan: Plan, parallel, *,
    profile: ImageDataset | None, reference: Classifier | None, on_progress: Callable[[dict], None],
    step: Step = UNTRACKED,
) -> dict:
    """The 23 metrics (and the additional ones) over the evaluated set, one entry each with
    its group, value, direction and settings. ``on_progress`` receives the section once the
    streamed metrics have values and again with the corruption errors (mCE); ``step``
    advances per batch of each pass (profiling, streamed metrics, corruption errors)."""
    if reference is not None:
        if tuple(reference.input_shape) != tuple(classifier.input_shape) or reference.num_classes != classifier.num_classes:
            raise ValueError(f"reference model {reference.name!r} takes {tuple(reference.input_shape)} and predicts "
                             f"{reference.num_classes} classes; {classifier.name!r} takes "
                             f"{tuple(classifier.input_shape)} and predicts {classifier.num_classes}")
        reference = parallel.replicate(reference)
    widths = _layer_widths(run, classifier)
    ebd_directions = min(1000, int(np.prod(classifier.input_shape))) if run.ebd_directions is None else run.ebd_directions
    ssim_window = _ssim_window(classifier.input_shape)
    preset = run.preset or noise.default_preset(tuple(dataset.image_shape))
    settings = _settings(run, widths, profile, reference, ebd_directions, ssim_window, preset)
    section = {"status": "running", "settings": run.as_dict() | {"reference": None if reference is None else reference.name},
               "results": [], "corruption_errors": None}
    problems: dict[str, tuple[str, str]] = {}  # metric -> (status, reason) where no value can be computed
    if reference is None:
        reason = "needs a reference model (plan: metrics.reference)"
        problems |= {name: ("skipped", reason) for name in _NEEDS_REFERENCE}
        if run.mce_baseline == "reference":
            problems |= {name: ("skipped", reason) for name in _CORRUPTION}
    profiled = profile is not None and tuple(profile.image_shape) == tuple(classifier.input_shape)
    evaluated = dataset.num_examples if plan.num_examples is None else min(plan.num_examples, dataset.num_examples)
    corrupted = 0 if _CORRUPTION <= problems.keys() else len(run.corruptions) * len(run.severities)
    step.expect((_num_batches(profile.num_examples, parallel) if profiled else 0)
                + _num_batches(evaluated, parallel) * (1 + corrupted))  # the passes, in batches
    with timed() as timing:
        bounds = None
        if profile is None:
            problems |= {name: ("skipped", "needs a profiling set for the neuron bounds (plan: metrics.profile_split)")
                         for name in _BOUNDED}
        elif tuple(profile.image_shape) != tuple(classifier.input_shape):
            reason = (f"the profiling set {profile.name!r} holds images of shape {tuple(profile.image_shape)}; "
                      f"model {classifier.name!r} takes {tuple(classifier.input_shape)}")
            problems |= {name: ("skipped", reason) for name in _BOUNDED}
        else:
            try:
                bounds = _profile_bounds(run, widths, classifier, profile, parallel, step)
            except Exception as error:  # recorded; the other metrics still run
                problems |= {name: ("failed", f"{type(error).__name__}: {error}") for name in _BOUNDED}
        static = _Static(tuple(widths), run.conv_neuron, float(run.rgb_sigma), run.ric_quality,
                         reference is not None, bounds is not None)
        state, count = _stream(run, static, _empty_state(run, static, widths, bounds, ssim_window), classifier,
                               reference, dataset, plan, parallel, ebd_directions, step)
        with_capped = state["EBD-2"].replace(include_capped=True)  # the fraction is defined when all are capped
        settings["EBD-2"]["capped_fraction"] = float(with_capped.compute()["capped_fraction"])
        pending = {name: ("running", "computed after the streamed metrics") for name in _CORRUPTION}
        section["results"] = _entries(settings, _values(run, state, None), pending | problems)
        on_progress(section)
        errors = None
        if not _CORRUPTION <= problems.keys():
            models = {"model": classifier} | ({} if reference is None else {"reference": reference})
            try:
                errors = _corruption_errors(run, models, dataset, plan, parallel, preset,
                                            jax.random.fold_in(jax.random.key(plan.seed), _CORRUPTION_STREAM), step)
            except Exception as error:  # recorded; the other metrics keep their values
                problems |= {name: ("failed", f"{type(error).__name__}: {error}") for name in _CORRUPTION}
            else:
                section["corruption_errors"] = {"names": list(run.corruptions), "severities": list(run.severities),
                                                **{name: e.tolist() for name, e in errors.items()}}
        section["results"] = _entries(settings, _values(run, state, errors), problems)
    section["timing"] = timing.as_dict(count)
    section["status"] = "incomplete" if any(r["status"] == "failed" for r in section["results"]) else "ok"
    return section
