"""``report.html``: one self-contained page (inline CSS, matplotlib figures as inline SVG,
images as PNG data URIs, no script, nothing fetched) that renders every section of a
report, and says of each absent one whether the plan left it out or the run ended first."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from robustjax.report import plots
from robustjax.report.page import document, escape, figure, number, percent, table, write
from robustjax.report.summary import attack_times

SECTIONS = {
    "summary": "Summary",
    "attacks": "Robust accuracy against epsilon",
    "corruptions": "Corruptions",
    "sequences": "Perturbation sequences (ImageNet-P)",
    "system_noise": "System noise",
    "certified": "Certified robust accuracy",
    "proxies": "Training-free proxies",
    "natural_shift": "Natural distribution shift",
    "metrics": "The 23 metrics (arXiv 2101.09617)",
    "calibration": "Calibration",
    "sanity": "Checks against gradient masking",
    "gallery": "Gallery",
    "reproduce": "Plan, keys and versions",
}
FILE = "report.html"
ENDED = {"interrupted": "was interrupted", "killed": "was killed", "failed": "failed"}
ARROWS = {"higher": "&uarr;&nbsp;higher", "lower": "&darr;&nbsp;lower"}
PLANNED = ("attacks", "corruptions", "sequences", "system_noise", "certified", "proxies", "natural_shift", "metrics",
           "sanity")  # a plan may leave out


def _json(value) -> str:
    return f"<pre>{escape(json.dumps(value, indent=2))}</pre>"


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>{body}</details>"


def _planned(report: dict, part: str) -> bool:
    plan = report["plan"]
    if part == "attacks":
        return bool(plan.get("attacks"))
    if part == "sanity":
        # reports before schema 4 had no checks; unset (null) runs them in robustjax evaluate
        return (plan.get("sanity") or {}).get("enabled", False) is not False
    return plan.get(part) is not None


def _missing(report: dict, what: str = "it") -> str:
    """Why a planned section is absent: the run ended before it, or is still going."""
    status = report["status"]
    if status in ENDED:
        return f"Missing: the run {ENDED[status]} before {what}."
    if status == "running":
        return f"Not computed yet: the run was still going when this page was written, before {what}."
    return "Missing from the report."


def _absent(report: dict, part: str) -> str | None:
    """A sentence for a section with nothing to show, else None."""
    present = bool(report.get(part)) if part == "attacks" else report.get(part) is not None
    if present:
        return None
    return _missing(report) if _planned(report, part) else "Not in this plan."


def _partial(report: dict, section: dict) -> str:
    """A note for a section the run did not finish, else nothing."""
    if section.get("status") != "running":
        return ""
    status = report["status"]
    why = f"the run {ENDED[status]}" if status in ENDED else "the run was still going"
    return f"<p class=note>Partial: {why} before this section finished; below is what it measured until then.</p>"


def _failed(section: dict) -> str | None:
    return f"<p class=error>Failed: {escape(section['error'])}</p>" if section.get("status") == "failed" else None


def _failed_items(section: dict) -> list[str]:
    """A line per item of ``section`` that failed (a corruption, a perturbation, a set)."""
    return [f"<p class=error>{escape(f['name'])} failed: {escape(f['error'])}</p>" for f in section.get("failed", [])]


def _budgets(report: dict) -> list[tuple[str, float, float, list[str]]]:
    """Per threat model (norm, eps) of the finished attacks: the worst-case robust accuracy
    (per example where the report has it, else the one attack's) and the attacks."""
    worst = {(entry["norm"], entry["eps"]): entry for entry in report.get("worst_case", [])}
    budgets: dict[tuple[str, float], list[dict]] = {}
    for entry in report["attacks"]:
        if entry["status"] == "ok" and entry["params"].get("eps") is not None:
            budgets.setdefault((entry["params"].get("norm", "linf"), entry["params"]["eps"]), []).append(entry)
    rows = []
    for (norm, eps), entries in sorted(budgets.items()):
        accuracy = worst[norm, eps]["robust_accuracy"] if (norm, eps) in worst else min(
            e["robust_accuracy"] for e in entries)
        rows.append((norm, eps, accuracy, [e["name"] for e in entries]))
    return rows


def _summary(report: dict, gallery) -> str:
    model, dataset, clean = report["model"], report["dataset"], report.get("clean")
    status = report["status"]
    weights = model.get("weights") or {}
    rows = [["model", f"{escape(model['name'])} ({model['num_params']:,} parameters, input "
                      f"{'x'.join(map(str, model['input_shape']))}, {model['num_classes']} classes)"],
            ["weights", f"{escape(weights.get('source') or 'as given')}, sha256 {escape(weights['sha256'])}"
                        if weights.get("sha256") else "not recorded"],
            ["data", f"{escape(dataset['name'])}, {dataset['num_examples']:,} examples"
                     + (f", sha256 {escape(dataset['sha256'])}" if dataset.get("sha256") else "")],
            ["status", f"<span class=status-{escape(status)}>{escape(status)}</span>"
                       + (f": {escape(report['error'])}" if report.get("error") else "")],
            ["started", escape(report["created"])],
            ["clean accuracy", percent(clean["accuracy"]) if clean else escape(_missing(report, "the clean pass"))]]
    for norm, eps, accuracy, names in _budgets(report):
        rows.append([f"worst-case robust accuracy, {escape(norm)} eps={number(eps)}",
                     f"{percent(accuracy)} <small>(over {escape(', '.join(names))})</small>"])
    if (corruptions := report.get("corruptions")) and corruptions.get("mce") is not None:
        rows.append(["mCE (relative mCE)", f"{percent(corruptions['mce'])} ({percent(corruptions['relative_mce'])})"])
    if (sequences := report.get("sequences")) and sequences.get("mean_flip_probability") is not None:
        rows.append(["mean flip probability", percent(sequences["mean_flip_probability"])])
    if (certified := report.get("certified")) and certified.get("intervals"):
        for entry in certified["intervals"]:
            if entry["attacked"] is not None:
                rows.append([f"robust accuracy, linf eps={number(entry['eps'])}, certified to attacked",
                             f"{percent(entry['certified'])} to {percent(entry['attacked'])}"])
    if (system := report.get("system_noise")) and system.get("mean_accuracy") is not None:
        rows.append(["system noise: mean accuracy (std)", f"{percent(system['mean_accuracy'])} "
                                                          f"({percent(system['std_accuracy'])})"])
    parts = [table(["", ""], rows)]
    sanity = report.get("sanity")
    if sanity is not None and sanity["status"] != "failed":
        verdicts = [check["verdict"] for check in sanity.get("checks", [])]
        parts.append(f"<p>Checks against gradient masking: {verdicts.count('pass')} passed, "
                     f"{verdicts.count('warn')} warned, {verdicts.count('skipped')} skipped.</p>")
        parts += [f"<p class=note><b>{escape(check['name'])}</b>: {escape(check['message'])}. Advice: {escape(check['advice'])}</p>"
                  for check in sanity.get("checks", []) if check["verdict"] == "warn"]
    failed = [entry["name"] for entry in report["attacks"] if entry["status"] == "failed"]
    failed += [part for part in SECTIONS if isinstance(report.get(part), dict)
               and report[part].get("status") in ("failed", "incomplete")]
    if failed:
        parts.append(f"<p class=error>Failed or incomplete: {escape(', '.join(failed))} (see their sections).</p>")
    absent = [SECTIONS[part] for part in PLANNED if _planned(report, part) and _absent(report, part)]
    if absent:
        parts.append(f"<p class=note>{escape(_missing(report, 'these sections'))} {escape('; '.join(absent))}</p>")
    return "".join(parts)


def _attack_label(entry: dict) -> str:
    params = {k: v for k, v in entry["params"].items() if k not in ("eps", "norm") and v is not None}
    shown = [f"{k}={v}" for k, v in params.items() if k in ("steps", "restarts", "loss", "version") and v != 1]
    return " ".join([entry["name"], *shown])


def _attacks(report: dict, gallery) -> str:
    attacks = report["attacks"]
    curves: dict[str, dict[str, tuple[list, list]]] = {}
    for entry in attacks:
        if entry["status"] == "ok" and entry["params"].get("eps") is not None:
            line = curves.setdefault(entry["params"].get("norm", "linf"), {}).setdefault(_attack_label(entry), ([], []))
            line[0].append(entry["params"]["eps"])
            line[1].append(entry["robust_accuracy"])
    for entry in report.get("worst_case", []):
        line = curves.setdefault(entry["norm"], {}).setdefault("worst case over attacks", ([], []))
        line[0].append(entry["eps"])
        line[1].append(entry["robust_accuracy"])
    if (certified := report.get("certified")) and certified.get("intervals"):
        for entry in certified["intervals"]:
            line = curves.setdefault(entry["norm"], {}).setdefault("certified (best bound)", ([], []))
            line[0].append(entry["eps"])
            line[1].append(entry["certified"])
    parts = []
    if curves:
        clean = report["clean"]["accuracy"] if report.get("clean") else None
        lines = {norm: [(label, *map(list, zip(*sorted(zip(*xy))))) for label, xy in by_label.items()]
                 for norm, by_label in curves.items()}
        parts.append(figure(plots.robust_accuracy(lines, clean), "Robust accuracy (share of all evaluated examples "
                             "classified correctly clean and under the attack) against the attack's budget; each "
                             "line starts at the clean accuracy. Worst case (the grey band beneath): an example "
                             "counts only if every attack at that budget failed on it. Certified (dashed, with "
                             "a [certify] table): the lower bound, an example counts when a bound proves it "
                             "robust; the true robust accuracy lies between it and the attacks."))
    rows, times = [], attack_times(attacks)
    for entry, timing in zip(attacks, times, strict=True):
        params = escape(", ".join(f"{k}={v}" for k, v in entry["params"].items() if v is not None))
        if entry["status"] != "ok":
            rows.append([escape(entry["name"]), f"{params}<br><span class=failed>{escape(entry.get('error', ''))}</span>",
                         "<span class=failed>failed</span>", "", "", "", "", ""])
            continue
        norms = entry["perturbation"] or {}
        rows.append([escape(entry["name"]), params, percent(entry["robust_accuracy"]), percent(entry["attack_success_rate"]),
                     number(norms.get("linf_mean")), number(norms.get("l2_mean")), number(entry["queries_mean"]),
                     "" if timing is None else f"{timing['wall_s']:.1f}"])
    parts.append(table(["attack", "parameters", "robust accuracy", "success", "mean Linf", "mean L2", "queries",
                         "time (s)"], rows, numeric={2, 3, 4, 5, 6, 7}))
    if any(timing is None for entry, timing in zip(attacks, times, strict=True) if entry["status"] == "ok"):
        parts.append("<p class=note>One pass evaluates an epsilon sweep: its time is on its first row.</p>")
    if report.get("worst_case"):
        parts.append(table(["norm", "eps", "attacks", "robust accuracy", "WCAR"],
                            [[escape(w["norm"]), number(w["eps"]), escape(", ".join(w["attacks"])), percent(w["robust_accuracy"]),
                              percent(w["wcar"])] for w in report["worst_case"]], numeric={1, 3, 4}))
    if len(attacks) < len(report["plan"]["attacks"]):
        parts.append(f"<p class=note>{len(report['plan']['attacks']) - len(attacks)} of the plan's "
                     f"{len(report['plan']['attacks'])} attack entries are absent. "
                     f"{escape(_missing(report, 'them'))}</p>")
    return "".join(parts)


def _severity_heatmap(results: list[dict], severities: list[int], name: str, caption: str) -> str:
    """A figure of top-1 accuracy per corruption (rows, in the order first met) and severity."""
    names = list(dict.fromkeys(r["name"] for r in results))
    grid = np.full((len(names), len(severities)), np.nan)
    for r in results:
        grid[names.index(r["name"]), severities.index(r["severity"])] = r["accuracy"]
    return figure(plots.heatmap(grid, names, [str(s) for s in severities], xlabel="severity", ylabel="corruption",
                                colorbar="accuracy", name=name), caption)


def _ce_table(per_corruption: list[dict], baseline: str | None) -> str:
    """Each corruption's mean error, corruption error and relative CE against ``baseline``."""
    rows = [[escape(c["name"]), escape(c["family"]), percent(c["mean_error"]), percent(c.get("ce")),
             percent(c.get("relative_ce"))] for c in per_corruption]
    ce = "CE" if baseline is None else f"CE (vs {escape(baseline)})"
    return table(["corruption", "family", "mean error", ce, "relative CE"], rows, numeric={2, 3, 4})


def _corruptions(report: dict, gallery) -> str:
    section = report["corruptions"]
    if (failed := _failed(section)) is not None:
        return failed
    parts = [_partial(report, section)]
    if section["results"]:
        parts.append(_severity_heatmap(section["results"], section["severities"], "corruptions",
                                       f"Top-1 accuracy (%) per corruption and severity ({escape(section['preset'])} "
                                       "constants)."))
    if section.get("per_corruption"):
        parts.append(_ce_table(section["per_corruption"], section.get("baseline_model") or section.get("baseline")))
    if section.get("mean_error") is not None:
        parts.append(f"<p>Mean error {percent(section['mean_error'])}; mCE {percent(section.get('mce'))}, relative mCE "
                     f"{percent(section.get('relative_mce'))} (CE: summed errors over the baseline's, Hendrycks &amp; "
                     f"Dietterich 2019; '-' without a baseline).</p>")
    for key in ("mce_reason", "relative_mce_reason"):
        if section.get(key):
            parts.append(f"<p>{escape(section[key])}.</p>")
    parts += _failed_items(section)
    return "".join(parts)


def _sequences(report: dict, gallery) -> str:
    section = report["sequences"]
    if (failed := _failed(section)) is not None:
        return failed
    parts = [_partial(report, section)]
    results = section["results"]
    if results:
        parts.append(figure(plots.bars([r["name"] for r in results], [r["flip_probability"] for r in results],
                                        xlabel="flip probability", name="flip-probability"),
                             f"Share of frames whose prediction differs from the reference frame (difficulty "
                             f"{section['difficulty']}); lower is more stable."))
        parts.append(table(["perturbation", "family", "flip probability", "top-5 distance"],
                            [[escape(r["name"]), escape(r["family"]), percent(r["flip_probability"]),
                              number(r["top5_distance"])] for r in results], numeric={2, 3}))
    if section.get("mean_flip_probability") is not None:
        parts.append(f"<p>Mean flip probability {percent(section['mean_flip_probability'])}, mean top-5 distance "
                     f"{number(section['mean_top5_distance'])}.</p>")
    parts += _failed_items(section)
    return "".join(parts)


def _system_noise(report: dict, gallery) -> str:
    section = report["system_noise"]
    if (failed := _failed(section)) is not None:
        return failed
    decoders, resizes = section["decoders"], section["resizes"]
    grid = np.full((len(decoders), len(resizes)), np.nan)
    for r in section["results"]:
        grid[decoders.index(r["decoder"]), resizes.index(r["resize"])] = r["accuracy"]
    return figure(plots.heatmap(grid, decoders, resizes, xlabel="resize", ylabel="decoder", colorbar="accuracy",
                                 name="system-noise"),
                   f"Top-1 accuracy (%) per JPEG decoder (quality {section['quality']}) and resize interpolation. "
                   f"Mean {percent(section['mean_accuracy'])}, std {percent(section['std_accuracy'])} (RobustART's score: "
                   f"{number(section['negative_std'])}, higher is more robust).")


def _certified(report: dict, gallery) -> str:
    section = report["certified"]
    if (failed := _failed(section)) is not None:
        return failed
    parts = []
    if section["intervals"]:
        parts.append("<p>Robust accuracy lies between a certified lower bound (an example counts when a bound "
                     "proves every image within eps classified correctly) and the attacks' upper bound (an "
                     "example counts when every attack at that eps failed on it). A contradiction, an example "
                     "verified yet broken, would mean an unsound bound.</p>")
        parts.append(table(["norm", "eps", "certified", "attacked", "width", "attacks", "contradictions"],
                           [[escape(e["norm"]), number(e["eps"]), percent(e["certified"]), percent(e["attacked"]),
                             "" if e["width"] is None else percent(e["width"]), escape(", ".join(e["attacks"])),
                             "" if e["contradictions"] is None else str(e["contradictions"])]
                            for e in section["intervals"]], numeric={1, 2, 3, 4, 6}))
        parts.append(table(["bound", "norm", "eps", "verified accuracy"],
                           [[escape(e["method"]), escape(e["norm"]), number(e["eps"]), percent(e["verified_accuracy"])]
                            for e in section["bounds"]], numeric={2, 3}))
    if (smoothing := section["smoothing"]) is not None:
        parts.append(f"<p>Randomized smoothing (Cohen et al. 2019), sigma={number(smoothing['sigma'])}, "
                     f"n0={smoothing['n0']}, n={smoothing['n']:,}, alpha={number(smoothing['alpha'])}: the certified "
                     "accuracy of the smoothed classifier, a different classifier from the network the attacks "
                     "ran on, at each L2 radius.</p>")
        parts.append(table(["L2 radius", "certified accuracy"],
                           [[number(e["radius"]), percent(e["certified_accuracy"])] for e in smoothing["results"]],
                           numeric={0, 1}))
    return "".join(parts)


def _proxies(report: dict, gallery) -> str:
    section = report["proxies"]
    if (failed := _failed(section)) is not None:
        return failed
    return ("<p>Training-free proxies of robustness (robustjax.metrics.proxies): lower Jacobian norm, Hessian "
            "eigenvalue magnitude and NTK condition number usually go with a more robust network; across many "
            "networks, robustjax sweep analyze ranks them against the robust figures.</p>"
            + table(["proxy", "mean", "median"], [[escape(e["name"]), number(e["mean"]), number(e["median"])]
                                                  for e in section["results"]], numeric={1, 2}))


def _natural_shift(report: dict, gallery) -> str:
    section = report["natural_shift"]
    parts = [_partial(report, section)]
    results = section["results"]
    accuracies = [(e["name"], e["accuracy"] if e["kind"] == "classification" else e["mean_accuracy"])
                  for e in results if e["kind"] != "ood"]
    if accuracies:
        parts.append(figure(plots.bars([name for name, _ in accuracies], [value for _, value in accuracies],
                                        xlabel="accuracy", name="natural-shift-accuracy"),
                             "Top-1 accuracy per released set: on ImageNet-A and -R with the logits masked to the "
                             "set's 200 classes; on ImageNet-C and CIFAR-10-C the mean over corruptions and "
                             "severities."))
    rows = [[escape(e["name"]), f"{e['num_examples']:,}", str(e["num_classes"]),
             percent(e["accuracy"] if e["kind"] == "classification" else e["mean_accuracy"]),
             number(e["calibration"]["rms_calibration_error"]), number(e["calibration"]["expected_calibration_error"]),
             number(e["calibration"]["aurra"]), f"{e['timing']['wall_s']:.1f}"] for e in results if e["kind"] != "ood"]
    if rows:
        parts.append(table(["dataset", "examples", "classes", "accuracy", "RMS calibration error", "ECE", "AURRA",
                            "time (s)"], rows, numeric={1, 2, 3, 4, 5, 6, 7}))
    ood = [[escape(e["name"]), escape(e["in_distribution"]), f"{e['num_ood']:,}", f"{e['num_in_distribution']:,}",
            percent(e["auroc"]), percent(e["aupr"]), percent(e["fpr_at_95_tpr"])] for e in results if e["kind"] == "ood"]
    if ood:
        parts.append(table(["out-of-distribution set", "in-distribution", "OOD images", "in-distribution images",
                            "AUROC", "AUPR", "FPR at 95% TPR"], ood, numeric={2, 3, 4, 5, 6}))
        parts.append("<p>OOD detection with the out-of-distribution images as the positive class and the anomaly "
                     "score minus the maximum softmax probability (over ImageNet-O's 200 classes for ImageNet-O); "
                     "AUROC and AUPR higher, FPR lower is better.</p>")
    for entry in (e for e in results if e["kind"] == "corruptions"):
        parts.append(f"<h3>{escape(entry['name'])}</h3>")
        parts.append(_severity_heatmap(entry["results"], sorted({r["severity"] for r in entry["results"]}),
                                       f"shift-{entry['name']}",
                                       f"Top-1 accuracy (%) per corruption and severity on the released "
                                       f"{escape(entry['name'])} ({entry['num_examples']:,} images each, from "
                                       f"{escape(entry['source'])})."))
        parts.append(_ce_table(entry["per_corruption"], "AlexNet"))
        parts.append(f"<p>Mean error {percent(entry['mean_error'])}; mCE {percent(entry.get('mce'))}, relative mCE "
                     f"{percent(entry.get('relative_mce'))} ('-': AlexNet's errors exist for ImageNet-C's 15 "
                     "benchmark corruptions only, and mCE needs all 15 at severities 1-5).</p>")
    parts += _failed_items(section)
    return "".join(parts)


def _metrics(report: dict, gallery) -> str:
    section = report["metrics"]
    if (failed := _failed(section)) is not None:
        return failed
    parts = [_partial(report, section)]
    groups: dict[str, list[dict]] = {}
    for entry in section["results"]:
        groups.setdefault(entry["group"], []).append(entry)
    for group, entries in groups.items():
        rows = [["" if e["index"] is None else str(e["index"]), escape(e["name"]),
                 number(e["value"]) if e["status"] == "ok" else escape(e["status"]), ARROWS.get(e["direction"], ""),
                 escape(e["description"] if e["status"] == "ok" else e.get("reason", "")),
                 _details("settings", _json(e["settings"])) if e.get("settings") else ""] for e in entries]
        parts.append(f"<h3>{escape(group)}</h3>" + table(["#", "metric", "value", "better", "definition", ""], rows,
                                                       numeric={0, 2}))
    parts.append("<p>Better: the direction that means a more robust model (for coverage, a more thorough "
                 "adversarial test set; for the additional metrics, a better defence).</p>")
    parts.append(_details("the metrics' settings", _json(section["settings"])))
    return "".join(parts)


def _calibration(report: dict, gallery) -> str:
    if (clean := report.get("clean")) is None:
        return f"<p class=absent>{escape(_missing(report, 'the clean pass'))}</p>"
    calibration = clean["calibration"]
    numbers = (f"<p>ECE (15 bins) {number(calibration['expected_calibration_error'])}, RMS calibration error "
               f"{number(calibration['rms_calibration_error'])}, AURRA {number(calibration['aurra'])} (lower, lower, "
               f"higher is better).</p>")
    bins = calibration.get("reliability")
    if bins is None:
        return numbers + "<p class=absent>This report has no per-bin calibration data (it was written before " \
                         "robustjax recorded it), so the reliability diagram cannot be drawn.</p>"
    return numbers + figure(plots.reliability(bins["count"], bins["confidence"], bins["accuracy"]),
                             "Reliability diagram of the clean predictions: accuracy and mean confidence per "
                             "confidence bin (a calibrated model sits on the diagonal), and the share of examples "
                             "per bin.")


def _sanity(report: dict, gallery) -> str:
    section = report["sanity"]
    if (failed := _failed(section)) is not None:
        return failed
    rows = [[f"<span class={escape(c['verdict'])}>{escape(c['verdict'])}</span>",
             escape(c["name"]) + _details("value, reference", _json(c.get("value")) + escape(c["reference"])),
             escape(c["message"] if c["verdict"] != "skipped" else c.get("reason", c["message"])),
             escape(c["advice"] if c["verdict"] == "warn" else "")] for c in section["checks"]]
    return f"<p>On {section['num_examples']} correctly classified examples.</p>" + table(
        ["verdict", "check", "seen", "advice"], rows)


def _gallery(report: dict, gallery: Mapping[str, np.ndarray] | None) -> str:
    if gallery is None:
        return ("<p class=absent>No gallery: gallery.npz is written beside report.json by <code>robustjax "
                "evaluate</code> once a run ends without interruption.</p>")
    kinds = [("clean", "clean")]
    if "adversarial" in gallery:
        kinds.append(("adversarial", f"adversarial: {gallery['attack']}"))
    kinds.append(("corrupted", f"corrupted: {gallery['corruption']}"))
    header = ["label", *(escape(title) for _, title in kinds)]
    if "adversarial" in gallery:
        header.insert(3, "perturbation, magnified")
    rows = []
    for i, label in enumerate(gallery["label"]):
        row = [str(int(label))]
        for kind, _ in kinds:
            prediction, confidence = int(gallery[f"{kind}_prediction"][i]), float(gallery[f"{kind}_confidence"][i])
            mark = "" if prediction == label else " &#10007;"
            row.append(f"<img alt='{kind} {i}' src='{plots.png_data_uri(gallery[kind][i])}'>"
                       f"predicted {prediction} ({percent(confidence)}){mark}")
            if kind == "adversarial":
                delta = gallery["adversarial"][i] - gallery["clean"][i]
                scale = float(np.abs(delta).max())
                magnified = 0.5 + delta / (2 * scale) if scale > 0 else np.full_like(delta, 0.5)
                row.append(f"<img alt='perturbation {i}' src='{plots.png_data_uri(magnified)}'>"
                           f"{f'x{0.5 / scale:.1f}, max |&delta;| {scale:.3g}' if scale > 0 else 'none'}")
        rows.append(row)
    return ("<div class=gallery>" + table(header, rows) + "</div><p>The first evaluated examples with the model's "
            "predictions (&#10007;: wrong). The perturbation is shown around mid-grey, scaled so that its largest "
            "change fills the range.</p>")


def _settings(settings: dict) -> str:
    """``settings`` (a plan's or a section's) as "key=value" text, unset ones left out."""
    return ", ".join(f"{key}={value}" for key, value in settings.items()
                     if value is not None and not isinstance(value, dict | list))


def runnable_plan(plan: dict) -> dict:
    """``plan`` (a report's, as ``Plan.as_dict`` writes it: one attack entry per epsilon, null
    for unset settings) as a plan file that ``robustjax evaluate --plan`` reads back into the
    same plan: unset settings left out, and consecutive attack entries that differ only in
    epsilon joined into one epsilon sweep."""
    def without_unset(value):
        if isinstance(value, dict):
            return {key: without_unset(part) for key, part in value.items() if part is not None}
        return [without_unset(part) for part in value] if isinstance(value, list) else value

    attacks: list[dict] = []
    for entry in without_unset(plan.get("attacks", [])):
        previous = attacks[-1] if attacks else {}
        if {**previous, "eps": None} == {**entry, "eps": None} and "eps" in entry:
            previous["eps"] = [*np.atleast_1d(previous["eps"]).tolist(), entry["eps"]]
        else:
            attacks.append(entry)
    return {**without_unset(plan), "attacks": attacks}


def _plan(plan: dict) -> str:
    """The plan as run, one row per section (each attack its own row), then the whole plan as
    JSON, a file ``robustjax evaluate --plan`` reads back."""
    rows = [["run", escape(_settings(plan))]]
    rows += [[f"attack: {escape(attack['name'])}", escape(_settings({k: v for k, v in attack.items() if k != "name"}))]
             for attack in plan.get("attacks", [])]
    for name, section in plan.items():
        if isinstance(section, dict) and section.get("enabled") is not False:
            text = _settings(section) + "".join(
                f"; {key}: {', '.join(map(str, value)) if isinstance(value, list) else _settings(value)}"
                for key, value in section.items() if isinstance(value, dict | list))
            rows.append([escape(name), escape(text.removeprefix("; "))])
    return table(["plan", "settings"], rows) + _details(
        "the plan as JSON (save it as plan.json: <code>robustjax evaluate --plan plan.json</code> runs it again)",
        _json(runnable_plan(plan)))


def _reproduce(report: dict, gallery) -> str:
    keys = report.get("randomness") or {}
    parts = [f"<p>Schema version {report['schema_version']}. The plan as run:</p>", _plan(report["plan"])]
    if keys:
        parts.append(table(["randomness", ""], [[escape(k), escape(v)] for k, v in keys.items() if k != "keys"]))
        parts.append(table(["section", "keys"], [[escape(k), escape(v if v is not None else "draws none")]
                                                  for k, v in keys.get("keys", {}).items()]))
    parts.append(table(["environment", ""], [[escape(k), escape(v)] for k, v in (report.get("environment") or {}).items()]))
    return "".join(parts)


RENDERERS: dict[str, Callable[[dict, Mapping | None], str]] = {
    "summary": _summary, "attacks": _attacks, "corruptions": _corruptions, "sequences": _sequences,
    "system_noise": _system_noise, "certified": _certified, "proxies": _proxies,
    "natural_shift": _natural_shift, "metrics": _metrics, "calibration": _calibration, "sanity": _sanity,
    "gallery": _gallery, "reproduce": _reproduce,
}


def render_html(report: dict, gallery: Mapping[str, np.ndarray] | None = None) -> str:
    """The page of ``report`` (a ``report.json`` as read back) and of the examples of
    ``gallery`` (``evaluation.gallery``'s arrays), every section with a heading whose id is
    its key in :data:`SECTIONS`."""
    body = []
    for part, title in SECTIONS.items():
        absent = _absent(report, part) if part in PLANNED else None
        content = f"<p class=absent>{escape(absent)}</p>" if absent else RENDERERS[part](report, gallery)
        body.append(f"<section id={part}><h2>{escape(title)}</h2>{content}</section>")
    nav = " ".join(f"<a href='#{part}'>{escape(title)}</a>" for part, title in SECTIONS.items())
    return document(f"robustjax: {report['model']['name']} on {report['dataset']['name']}",
                    f"<nav>{nav}</nav>{''.join(body)}")


def write_html(path: str | Path, report: dict, gallery: Mapping[str, np.ndarray] | None = None) -> None:
    """Writes :func:`render_html` to ``path`` (its folder made if missing), replacing it atomically."""
    write(path, render_html(report, gallery))
