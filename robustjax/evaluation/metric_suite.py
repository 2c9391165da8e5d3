"""The report section of the 23 metrics of "A Comprehensive Evaluation Framework for Deep
Model Robustness" (Guo, Liu et al., arXiv 2101.09617), grouped as the paper groups them
(data: neuron coverage, imperceptibility; model: behaviour, structure), followed by the
attack success rate and DEEPSEC's defence-comparison metrics (the model under test against
the plan's reference model).

The metrics read the adversarial examples of one attack-table entry (``Plan.metrics_source``)
in the same pass that runs it: :class:`MetricsPass` profiles the neuron bounds over the
profiling set first, then folds each batch of that entry's examples into every accumulator
(with the examples transferred from the reference and the EBD and EBD-2 probes of the clean
images). The figures other items already record are not recomputed but read from their
records (:func:`with_recorded_figures`): CA is the clean item's accuracy, AAW and ASR the
entry's per-example outcome, mCE and relative mCE the corruption section's. A metric that is
undefined on the data (no successful adversarial example, say) or cannot be computed is
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

from robustjax import metrics
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset
from robustjax.distributed import to_host
from robustjax.evaluation.parallel import predict
from robustjax.evaluation.plan import MetricsRun, Plan
from robustjax.evaluation.progress import UNTRACKED, Step
from robustjax.evaluation.resume import Finished
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
    ``source`` names the accumulator of the streamed state it comes from (None: read from
    another item's record, :data:`RECORDED`) and ``key`` its name among that accumulator's
    results (and in ``metrics.DIRECTIONS``)."""

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
    MetricInfo("CA", BEHAVIOUR, 9, None, "accuracy", "clean accuracy"),
    MetricInfo("AAW", BEHAVIOUR, 10, None, "accuracy", "accuracy under the white-box attack"),
    MetricInfo("AAB", BEHAVIOUR, 11, None, "accuracy", "accuracy under examples transferred from the reference"),
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
    MetricInfo("ASR", ADDITIONAL, None, None, "asr", "attack success rate over all examples"),
    MetricInfo("CAV", ADDITIONAL, None, "CAV", "cav", "clean accuracy of the model minus the reference's"),
    MetricInfo("CRR", ADDITIONAL, None, "CRR", "crr", "share the reference gets wrong and the model right"),
    MetricInfo("CSR", ADDITIONAL, None, "CSR", "csr", "share the reference gets right and the model wrong"),
    MetricInfo("CCV", ADDITIONAL, None, "CCV", "ccv", "true-class confidence change against the reference"),
    MetricInfo("COS", ADDITIONAL, None, "COS", "cos", "Jensen-Shannon divergence from the reference's output"),
)
_NEEDS_REFERENCE = {"AAB", "CAV", "CRR", "CSR", "CCV", "COS"}
_BOUNDED = {"KMNC", "NBC", "SNAC"}
_CORRUPTION = {"mCE", "relative_mCE"}
# Metrics read from the records of other items (the clean pass, the attack entry, the
# corruptions) and from the transferred examples' per-example outcome.
RECORDED = {"CA", "AAW", "ASR", "AAB"} | _CORRUPTION
# The stream of the plan's seed for this section's randomness (transfer attack and EBD).
_STREAM = 23


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
        "ACAC": behaviour.AdversarialClassConfidence.empty(),
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
            x, y, x_adv, distances, steps, capped):
    """Folds one batch of real examples into every accumulator."""
    logits, logits_adv = classifier(x), classifier(x_adv)
    features, features_adv = classifier.features(x), classifier.features(x_adv)
    values_adv = coverage.neuron_values(features_adv, static.layers, conv_neuron=static.conv_neuron)
    blurred = classifier(behaviour.blur_for_rgb(x_adv, static.rgb_sigma))
    compressed = classifier(behaviour.compress_for_ric(x_adv, static.ric_quality))
    new = dict(state)
    new.update(
        ACAC=state["ACAC"].update(logits_adv, y),
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


def _settings(run: MetricsRun, layers: dict[str, int], profile: ImageDataset | None, reference: Classifier | None,
              ebd_directions: int, ssim_window: int) -> dict[str, dict]:
    """Each metric's settings, as the report shows them next to its value."""
    attack = {"name": run.attack.name, **run.attack.params()}
    neurons = {"layers": list(layers), "neurons": sum(layers.values()), "conv_neuron": run.conv_neuron,
               "inputs": "adversarial examples"}
    bounds = {"bounds_profiled_on": None if profile is None else profile.name}
    over_success = {"over": "successful adversarial examples", "toolkit_compat": run.toolkit_compat}
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
        "mCE": {}, "relative_mCE": {},
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


def _values(state: dict) -> dict[str, Callable[[], float]]:
    """How each streamed metric's value comes from the accumulators; each raises ValueError
    with the reason when the metric is undefined on the data."""
    return {info.name: (lambda info=info: state[info.source].compute()[info.key])
            for info in CATALOGUE if info.source in state}


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


class MetricsPass:
    """The streamed metrics over one evaluation: built before the attack entry they read
    runs (it profiles the neuron bounds), fed each batch of that entry's adversarial
    examples (:meth:`update`), then made into the metrics item (:meth:`finish`). ``step``
    advances per batch of the profiling pass."""

    def __init__(self, run: MetricsRun, classifier: Classifier, plan: Plan, parallel, *,
                 profile: ImageDataset | None, reference: Classifier | None, step: Step = UNTRACKED):
        if reference is not None:
            if (tuple(reference.input_shape) != tuple(classifier.input_shape)
                    or reference.num_classes != classifier.num_classes):
                raise ValueError(f"reference model {reference.name!r} takes {tuple(reference.input_shape)} and "
                                 f"predicts {reference.num_classes} classes; {classifier.name!r} takes "
                                 f"{tuple(classifier.input_shape)} and predicts {classifier.num_classes}")
            reference = parallel.replicate(reference)
        self.run, self.classifier, self.reference, self.plan = run, classifier, reference, plan
        widths = _layer_widths(run, classifier)
        self.ebd_directions = (min(1000, int(np.prod(classifier.input_shape))) if run.ebd_directions is None
                               else run.ebd_directions)
        ssim_window = _ssim_window(classifier.input_shape)
        self.settings = _settings(run, widths, profile, reference, self.ebd_directions, ssim_window)
        self.problems: dict[str, tuple[str, str]] = {}  # metric -> (status, reason) where no value can be computed
        if reference is None:
            self.problems |= {name: ("skipped", "needs a reference model (plan: metrics.reference)")
                              for name in _NEEDS_REFERENCE}
        profiled = profile is not None and tuple(profile.image_shape) == tuple(classifier.input_shape)
        step.expect(_num_batches(profile.num_examples, parallel) if profiled else 0)
        with timed() as timing:
            bounds = None
            if profile is None:
                self.problems |= {name: ("skipped", "needs a profiling set for the neuron bounds (plan: "
                                         "metrics.profile_split)") for name in _BOUNDED}
            elif not profiled:
                reason = (f"the profiling set {profile.name!r} holds images of shape {tuple(profile.image_shape)}; "
                          f"model {classifier.name!r} takes {tuple(classifier.input_shape)}")
                self.problems |= {name: ("skipped", reason) for name in _BOUNDED}
            else:
                try:
                    bounds = _profile_bounds(run, widths, classifier, profile, parallel, step)
                except Exception as error:  # recorded; the other metrics still run
                    self.problems |= {name: ("failed", f"{type(error).__name__}: {error}") for name in _BOUNDED}
        self.static = _Static(tuple(widths), run.conv_neuron, float(run.rgb_sigma), run.ric_quality,
                              reference is not None, bounds is not None)
        self.state = _empty_state(run, self.static, widths, bounds, ssim_window)
        self.stream_key, self.ebd_key = jax.random.split(jax.random.fold_in(jax.random.key(plan.seed), _STREAM), 2)
        self.transfer_correct: list[np.ndarray] = []
        self.timing = timing

    def update(self, batch: int, x: jax.Array, y: jax.Array, mask: np.ndarray, x_adv: jax.Array) -> None:
        """Folds batch number ``batch`` (images ``x``, labels ``y``, host ``mask`` of real
        examples) and its adversarial examples ``x_adv`` into every accumulator."""
        with timed() as timing:
            classifier, reference, run = self.classifier, self.reference, self.run
            if reference is not None:
                key = jax.random.fold_in(jax.random.fold_in(self.stream_key, batch), 1)
                x_transfer = run.attack(reference, x, y, key=key).x_adv
                self.transfer_correct.append((to_host(predict(classifier, x_transfer)) == to_host(y))[mask])
            distances = structure.boundary_distances(classifier, x, y, key=self.ebd_key,
                                                     num_directions=self.ebd_directions)
            steps, capped = structure.boundary_steps(classifier, x, y, step_size=run.ebd2_step,
                                                     max_steps=run.ebd2_max_steps)
            self.state = _update(self.static, self.state, classifier, reference,
                                 *_real(mask, x, y, x_adv, distances, steps, capped))
        self.timing.wall_s += timing.wall_s
        self.timing.compile_s += timing.compile_s

    def finish(self, num_examples: int) -> Finished:
        """The metrics item: the section of the streamed metrics (the recorded ones pending,
        :func:`with_recorded_figures` fills them in), the transferred examples' per-example
        correctness and the accumulators' states."""
        settings = {**self.settings, "EBD-2": dict(self.settings["EBD-2"])}
        with_capped = self.state["EBD-2"].replace(include_capped=True)  # the fraction is defined when all are capped
        settings["EBD-2"]["capped_fraction"] = float(with_capped.compute()["capped_fraction"])
        pending = {name: ("running", "read from the records of other items") for name in RECORDED}
        section = {"status": "running",
                   "settings": self.run.as_dict() | {"reference": None if self.reference is None
                                                     else self.reference.name},
                   "results": _entries(settings, _values(self.state), pending | self.problems),
                   "timing": self.timing.as_dict(num_examples)}
        arrays = {f"state.{name}.{i}": np.asarray(leaf)
                  for name, accumulator in self.state.items() for i, leaf in enumerate(jax.tree.leaves(accumulator))}
        if self.reference is not None:
            arrays["transfer_correct"] = np.concatenate(self.transfer_correct)
        return Finished(section, arrays)


def _set(entry: dict, value: float | None, reason: str | None = None, status: str | None = None) -> None:
    """Gives a report entry its value, or no value with the reason (``status``: undefined by default)."""
    entry.pop("reason", None)
    if value is None:
        entry.update(value=None, status=status or "undefined", reason=reason)
    else:
        entry.update(value=float(value), status="ok")


def with_recorded_figures(section: dict, transfer_correct: np.ndarray | None, clean: dict,
                          source: dict, label: str, adversarial_correct: np.ndarray, clean_correct: np.ndarray,
                          corruptions: dict | None) -> dict:
    """The metrics ``section`` with the figures other items record: CA, the clean accuracy;
    AAW and ASR from ``adversarial_correct``, the per-example outcome of the attack entry
    ``source`` (its report section, ``label`` its figure label) whose examples the streamed
    metrics read; AAB from ``transfer_correct``; mCE and relative mCE, the ``corruptions``
    section's."""
    section = {**section, "results": [dict(entry) for entry in section["results"]]}
    entries = {entry["name"]: entry for entry in section["results"]}
    _set(entries["CA"], clean["accuracy"])
    aaw = float(adversarial_correct.mean())
    misclassified_robust = int((adversarial_correct & ~clean_correct).sum())
    for name in ("AAW", "ASR"):
        entries[name]["settings"] = {**entries[name]["settings"], "entry": label,
                                     "entry_robust_accuracy": source.get("robust_accuracy")}
    entries["AAW"]["settings"]["differs_from_robust_accuracy"] = (
        "AAW counts every example whose adversarial example the model classifies correctly; robust accuracy "
        f"also needs the clean image right: they differ by {misclassified_robust} such example(s) of "
        f"{adversarial_correct.size}")
    _set(entries["AAW"], aaw)
    _set(entries["ASR"], 1.0 - aaw)
    if entries["AAB"]["status"] != "skipped":
        _set(entries["AAB"], None if transfer_correct is None else float(transfer_correct.mean()),
             "no transferred examples were recorded", "failed")
    for name, key in (("mCE", "mce"), ("relative_mCE", "relative_mce")):
        entry = entries[name]
        if corruptions is None:
            _set(entry, None, "the plan has no [corruptions] table: mCE is the corruption section's", "skipped")
            continue
        entry["settings"] = {"baseline": corruptions.get("baseline"), "corruptions": list(corruptions["names"]),
                             "severities": list(corruptions["severities"]), "preset": corruptions.get("preset"),
                             "from": "the corruption section"}
        if corruptions.get("baseline") is None:
            _set(entry, None, "the plan's [corruptions] table names no baseline", "skipped")
        else:
            _set(entry, corruptions.get(key), corruptions.get(f"{key}_reason") or "the corruption section has none")
    section["status"] = "incomplete" if any(r["status"] == "failed" for r in section["results"]) else "ok"
    return section
