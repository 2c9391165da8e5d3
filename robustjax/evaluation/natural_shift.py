"""The ``natural_shift`` section: a model on released natural-shift sets (``data.shift``).

- ImageNet-A and ImageNet-R: top-1 accuracy with the logits masked to the set's 200 classes,
  and calibration on the masked softmax (RMS calibration error, ECE, AURRA), as
  ``hendrycks/natural-adv-examples`` and RobustART compute them;
- ImageNet-O and any folder of out-of-distribution images: OOD detection (AUROC, AUPR, FPR at
  95% TPR) with OOD as the positive class and ``-max softmax`` as the anomaly score. ImageNet-O
  masks the logits to its 200 classes and takes as in-distribution the evaluated dataset's
  examples of those classes (ImageNet validation images, as Hendrycks' code does); a folder
  takes every evaluated example with the full logits;
- ImageNet-C and CIFAR-10-C from their released files: accuracy per corruption and severity,
  mean error per corruption, AlexNet-normalised mCE and relative mCE (ImageNet-C with all 15
  benchmark corruptions at severities 1-5), and calibration over all their images.

Each set (each corruption of ImageNet-C and CIFAR-10-C) is one item of the resume store and one
step of the progress protocol, advancing per batch; a set that fails is recorded in ``failed``
and the others still run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from robustjax import metrics, noise
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset
from robustjax.data.shift import ShiftSet, image_files_folder, load_shift
from robustjax.distributed import to_host
from robustjax.evaluation import progress
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import NaturalShiftRun, Plan
from robustjax.evaluation.progress import OnStep, Step
from robustjax.evaluation.resume import Finished, ItemStore, run_item
from robustjax.evaluation.timing import Timing, timed

TPR = 0.95


def load_sets(run: NaturalShiftRun, classifier: Classifier) -> list[ShiftSet]:
    """Opens every set of ``run`` for ``classifier`` (images converted to its channels, those of
    varying size resized to ``run.image_size``) and checks, before any work, that the model can
    be evaluated on each: a set that is not there names the folder or the tfds command it
    needs; a model of other classes or input shape is refused with the reason."""
    channels, image_size = classifier.input_shape[-1], run.image_size
    sets = [load_shift(name, data_dir=run.data_dir, image_size=image_size, channels=channels,
                       corruptions=run.corruptions, severities=run.severities) for name in run.datasets]
    for spec in run.ood:
        folder = spec.removeprefix("folder:")
        dataset = image_files_folder(folder, num_classes=classifier.num_classes, image_size=image_size,
                                     channels=channels)
        sets.append(ShiftSet(spec, "ood", folder, classifier.num_classes, dataset=dataset))
    for shift_set in sets:
        check_model(shift_set, classifier)
    return sets


def check_model(shift_set: ShiftSet, classifier: Classifier) -> None:
    """Refuses ``classifier`` when its classes or input shape do not fit ``shift_set``."""
    if classifier.num_classes != shift_set.num_classes:
        why = ("its labels and class mask are indices among ImageNet's 1,000 classes (sorted wnids)"
               if shift_set.num_classes == 1000 else "its labels are CIFAR-10's 10 classes")
        raise ValueError(f"{shift_set.name} needs a model of {shift_set.num_classes} classes ({why}); model "
                         f"{classifier.name!r} predicts {classifier.num_classes}")
    parts = [shift_set.dataset] if shift_set.dataset is not None else list(shift_set.corrupted.values())[:1]
    for dataset in parts:
        if tuple(dataset.image_shape) != tuple(classifier.input_shape):
            raise ValueError(f"{shift_set.name}: images of shape {tuple(dataset.image_shape)} ({dataset.name}), model "
                             f"{classifier.name!r} expects {tuple(classifier.input_shape)}; pass image_size "
                             "(robustjax evaluate --image-size) to resize images of varying size")


@jax.jit
def _outputs(classifier: Classifier, x: jax.Array, subset: jax.Array | None):
    """Confidence and predicted class over the ``subset`` logits, and whether all logits are finite."""
    logits = classifier(x)
    return (metrics.shift.subset_confidence(logits, subset), metrics.shift.subset_predictions(logits, subset),
            jnp.isfinite(logits).all(axis=-1))


def _predictions(classifier: Classifier, dataset: ImageDataset, subset, limit: int | None, parallel: DataParallel,
                 step: Step) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per evaluated example: confidence, prediction (model's label space) and label."""
    subset = None if subset is None else np.asarray(subset, np.int32)
    confidence, prediction, labels = [], [], []
    for x, y, mask in step.track(parallel.batches(dataset, limit)):
        top, predicted, finite = (to_host(a) for a in _outputs(classifier, x, subset))
        if not finite[mask].all():
            raise ValueError(f"model {classifier.name!r} returns NaN or infinite logits on {dataset.name!r}")
        confidence.append(top[mask])
        prediction.append(predicted[mask])
        labels.append(to_host(y)[mask])
    return np.concatenate(confidence), np.concatenate(prediction), np.concatenate(labels)


def _calibration(confidence: np.ndarray, correct: np.ndarray) -> dict:
    return {
        "rms_calibration_error": float(metrics.calibration.rms_calibration_error(confidence, correct)),
        "expected_calibration_error": float(metrics.calibration.expected_calibration_error(confidence, correct)),
        "aurra": float(metrics.calibration.aurra(confidence, correct)),
    }


def _classification_item(shift_set: ShiftSet, classifier: Classifier, limit: int | None, parallel: DataParallel,
                         step: Step) -> Finished:
    with timed() as timing:
        confidence, prediction, labels = _predictions(classifier, shift_set.dataset, shift_set.subset, limit,
                                                      parallel, step)
    correct = prediction == labels
    entry = {"name": shift_set.name, "kind": "classification", "source": shift_set.source,
             "num_examples": int(correct.size),
             "num_classes": classifier.num_classes if shift_set.subset is None else len(shift_set.subset),
             "accuracy": float(correct.mean()), "calibration": _calibration(confidence, correct),
             "timing": timing.as_dict(correct.size)}
    return Finished(entry)


def _ood_item(shift_set: ShiftSet, classifier: Classifier, in_distribution: ImageDataset, in_limit: int | None,
              limit: int | None, parallel: DataParallel, step: Step) -> Finished:
    """OOD detection of ``shift_set`` against ``in_distribution`` (its examples of the set's
    classes when the set has a class subset)."""
    with timed() as timing:
        in_confidence, _, in_labels = _predictions(classifier, in_distribution, shift_set.subset, in_limit, parallel,
                                                   step)
        if shift_set.subset is not None:
            in_confidence = in_confidence[np.isin(in_labels, shift_set.subset)]
            if in_confidence.size == 0:
                raise ValueError(f"{shift_set.name}: the evaluated dataset {in_distribution.name!r} has no examples of "
                                 f"its {len(shift_set.subset)} classes, the in-distribution side of the test; evaluate "
                                 "on ImageNet validation images (e.g. --dataset tfds:imagenet2012 --split validation)")
        out_confidence, _, _ = _predictions(classifier, shift_set.dataset, shift_set.subset, limit, parallel, step)
        # anomaly score = -max softmax (metrics.shift.subset_anomaly_score), OOD the positive class
        measures = metrics.calibration.ood_detection(-in_confidence, -out_confidence, tpr=TPR)
    entry = {"name": shift_set.name, "kind": "ood", "source": shift_set.source, "in_distribution": in_distribution.name,
             "num_ood": int(out_confidence.size), "num_in_distribution": int(in_confidence.size),
             "num_classes": classifier.num_classes if shift_set.subset is None else len(shift_set.subset),
             "auroc": float(measures["auroc"]), "aupr": float(measures["aupr"]),
             "fpr_at_95_tpr": float(measures["fpr_at_tpr"]),
             "timing": timing.as_dict(int(in_confidence.size + out_confidence.size))}
    return Finished(entry)


def _corruption_item(shift_set: ShiftSet, corruption: str, severities: tuple[int, ...], classifier: Classifier,
                     limit: int | None, parallel: DataParallel, step: Step) -> Finished:
    """Accuracy of one corruption of a released set at every severity; the per-example
    confidence and correctness are kept for the set's calibration."""
    results, confidence, correct = [], [], []
    with timed() as timing:
        for severity in severities:
            top, prediction, labels = _predictions(classifier, shift_set.corrupted[(corruption, severity)], None, limit,
                                                   parallel, step)
            right = prediction == labels
            accuracy = float(right.mean())
            results.append({"name": corruption, "family": noise.get(corruption).family, "severity": severity,
                            "accuracy": accuracy, "error": 1.0 - accuracy})
            confidence.append(top)
            correct.append(right)
    return Finished({"results": results, "seconds": dataclasses.asdict(timing)},
                    {"confidence": np.concatenate(confidence), "correct": np.concatenate(correct)})


def corruption_errors(results: list[dict], clean_error: float, *, alexnet: bool) -> dict:
    """Mean error per corruption over its severities and its mean over corruptions; with
    ``alexnet`` (ImageNet-C), CE and relative CE per corruption against AlexNet's errors
    (``metrics.corruption``), and mCE and relative mCE when all 15 benchmark corruptions ran at
    severities 1-5 (None otherwise: a mean over fewer corruptions is not the benchmark's)."""
    names = list(dict.fromkeys(r["name"] for r in results))
    errors = [np.array([r["error"] for r in results if r["name"] == name]) for name in names]
    per_corruption = [{"name": name, "family": noise.get(name).family,
                       "mean_error": float(metrics.mean_corruption_error(e))} for name, e in zip(names, errors)]
    summary = {"per_corruption": per_corruption, "mce": None, "relative_mce": None,
               "mean_error": float(np.mean([c["mean_error"] for c in per_corruption])) if names else None}
    if not alexnet:
        return summary
    full = [name for name, e in zip(names, errors) if name in metrics.ALEXNET_IMAGENET_C_ERRORS
            and sorted(r["severity"] for r in results if r["name"] == name) == list(noise.SEVERITIES)]
    for entry, error in zip(per_corruption, errors):
        if entry["name"] in full:
            baseline = np.array(metrics.ALEXNET_IMAGENET_C_ERRORS[entry["name"]])
            entry["ce"] = float(metrics.corruption_error(error, baseline))
            entry["relative_ce"] = float(metrics.relative_corruption_error(error, clean_error, baseline,
                                                                          metrics.ALEXNET_CLEAN_ERROR))
    if set(full) == set(metrics.ALEXNET_IMAGENET_C_ERRORS):
        summary["mce"] = float(np.mean([c["ce"] for c in per_corruption if "ce" in c]))
        summary["relative_mce"] = float(np.mean([c["relative_ce"] for c in per_corruption if "ce" in c]))
    return summary


def natural_shift_section(
    run: NaturalShiftRun, sets: list[ShiftSet], classifier: Classifier, in_distribution: ImageDataset, plan: Plan,
    parallel: DataParallel, clean_accuracy: float, on_progress: Callable[[dict], None],
    store: ItemStore | None = None, on_step: OnStep = progress.ignore,
) -> dict:
    """Every set of ``sets`` (from :func:`load_sets`): one entry of ``results`` each, in the
    plan's order. ``in_distribution`` is the evaluated dataset (the in-distribution side of the
    OOD tests) and ``clean_accuracy`` the model's accuracy on it (relative mCE). ``on_progress``
    receives the section after each item."""
    limit = run.num_examples if run.num_examples is not None else plan.num_examples
    section = {"status": "running", "settings": run.as_dict(), "results": [], "failed": []}
    seconds = []

    def batches(dataset: ImageDataset, cap: int | None) -> int:
        total = dataset.num_examples if cap is None else min(cap, dataset.num_examples)
        return -(-total // parallel.batch_size)

    def attempt(label: str, item: str, units: int, compute: Callable[[Step], Finished]) -> Finished | None:
        try:
            with progress.step(on_step, f"natural shift {label}", units) as step:
                return run_item(store, item, lambda: compute(step))
        except Exception as error:  # recorded in the report; the other sets still run
            section["failed"].append({"name": label, "error": f"{type(error).__name__}: {error}"})
            return None
        finally:
            on_progress(section)

    for index, shift_set in enumerate(sets):
        item = f"natural-shift-{index}-{'ood-folder' if shift_set.name.startswith('folder:') else shift_set.name}"
        if shift_set.kind == "classification":
            finished = attempt(shift_set.name, item, batches(shift_set.dataset, limit), lambda step: _classification_item(
                shift_set, classifier, limit, parallel, step))
        elif shift_set.kind == "ood":
            units = batches(in_distribution, plan.num_examples) + batches(shift_set.dataset, limit)
            finished = attempt(shift_set.name, item, units, lambda step: _ood_item(
                shift_set, classifier, in_distribution, plan.num_examples, limit, parallel, step))
        else:
            finished = _corruption_set(shift_set, run, classifier, limit, parallel, clean_accuracy, section, item,
                                       attempt, batches)
        if finished is not None:
            section["results"].append(finished.section)
            seconds.append(finished.section["timing"])
            on_progress(section)
    wall = sum(s["wall_s"] for s in seconds)
    section["timing"] = {"wall_s": round(wall, 4), "compile_s": round(sum(s["compile_s"] for s in seconds), 4)}
    section["status"] = "ok" if not section["failed"] else "incomplete"
    return section


def _corruption_set(shift_set: ShiftSet, run: NaturalShiftRun, classifier: Classifier, limit: int | None,
                    parallel: DataParallel, clean_accuracy: float, section: dict, item: str, attempt,
                    batches) -> Finished | None:
    """ImageNet-C or CIFAR-10-C: one item per corruption, then the set's entry (None when every
    corruption failed)."""
    results, confidence, correct, seconds = [], [], [], []
    for corruption in run.corruptions:
        parts = [shift_set.corrupted[(corruption, s)] for s in run.severities]
        finished = attempt(f"{shift_set.name} {corruption}", f"{item}-{corruption}",
                           sum(batches(part, limit) for part in parts),
                           lambda step: _corruption_item(shift_set, corruption, run.severities, classifier, limit,
                                                         parallel, step))
        if finished is not None:
            results += finished.section["results"]
            seconds.append(finished.section["seconds"])
            confidence.append(finished.arrays["confidence"])
            correct.append(finished.arrays["correct"].astype(bool))
    if not results:
        return None
    confidence, correct = np.concatenate(confidence), np.concatenate(correct)
    timing = Timing(sum(s["wall_s"] for s in seconds), sum(s["compile_s"] for s in seconds))
    entry = {"name": shift_set.name, "kind": "corruptions", "source": shift_set.source,
             "num_examples": int(correct.size // len(results)), "num_classes": classifier.num_classes,
             "results": results, "mean_accuracy": float(np.mean([r["accuracy"] for r in results])),
             **corruption_errors(results, 1.0 - clean_accuracy, alexnet=shift_set.name == "imagenet-c"),
             "calibration": _calibration(confidence, correct), "timing": timing.as_dict(int(correct.size))}
    return Finished(entry)
