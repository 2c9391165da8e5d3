"""A readable terminal summary of a report."""

from __future__ import annotations

from collections.abc import Callable

from rich import box
from rich.table import Table
from rich.text import Text

SHOWN_PARAMS = ("eps", "steps")
NOISE_PARTS = ("corruptions", "sequences", "system_noise")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _seconds(timing: dict) -> str:
    return f"{timing['wall_s']:.1f} ({timing['compile_s']:.1f})"


def attack_times(attacks: list[dict]) -> list[dict | None]:
    """Each attack entry's timing, None for the later rows of an epsilon grid (one pass
    evaluates the whole grid, so its time is shown once, on the grid's first row)."""
    shown, previous = [], None
    for entry in attacks:
        timing = entry.get("timing") if entry["status"] == "ok" else None
        shown.append(None if timing is not None and timing.get("grid_size", 1) > 1 and timing == previous else timing)
        previous = timing
    return shown


def _label(section: dict) -> str:
    params = section["params"]
    shown = [f"{k}={_number(params[k]) if isinstance(params[k], float) else params[k]}"
             for k in SHOWN_PARAMS if k in params]
    norm = [params["norm"]] if "norm" in params else []
    return " ".join([section["name"], *norm, *shown])


def attack_table(report: dict) -> Table:
    """One row for clean accuracy, one per attack, one per worst case over attacks."""
    model, dataset = report["model"]["name"], report["dataset"]
    table = Table(title=f"{model} on {dataset['name']} ({dataset['num_examples']} examples)",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, caption="success: share of correctly classified "
                  "examples the attack fooled; norms: mean over those; time: seconds, of which compiling (an "
                  "epsilon sweep's, on its first row); worst case: robust only if every attack at that budget "
                  "failed")
    table.add_column("evaluation", ratio=1)
    for column in ("accuracy", "success", "Linf", "L2", "queries", "time"):
        table.add_column(column, justify="right", no_wrap=True)
    clean = report["clean"]
    if clean is not None:
        table.add_row("clean", _percent(clean["accuracy"]), "", "", "", "1", _seconds(clean["timing"]))
    for section, timing in zip(report["attacks"], attack_times(report["attacks"]), strict=True):
        if section["status"] != "ok":
            table.add_row(_label(section), "failed", section.get("error", ""), "", "", "", "")
            continue
        norms = section["perturbation"]
        table.add_row(
            _label(section), _percent(section["robust_accuracy"]), _percent(section["attack_success_rate"]),
            _number(norms["linf_mean"]), _number(norms["l2_mean"]), f"{section['queries_mean']:.1f}",
            "" if timing is None else _seconds(timing),
        )
    for entry in report.get("worst_case", []):
        table.add_row(f"worst case {entry['norm']} eps={_number(entry['eps'])}",
                      _percent(entry["robust_accuracy"]), "", "", "", "", "")
    _section_rows(table, "certified", report.get("certified"), _certified_rows)
    _section_rows(table, "proxies", report.get("proxies"), _proxies_rows)
    return table


def noise_table(report: dict) -> Table | None:
    """One row per corruption (accuracy, mean over severities) and for mCE, one per
    perturbation sequence (flip probability), one for system noise (mean accuracy over the
    decoder x resize variants); None when the report has none of these sections."""
    if all(report.get(part) is None for part in NOISE_PARTS):
        return None
    table = Table(title="natural and system noise", box=box.SIMPLE_HEAD,
                  caption="time: seconds, of which compiling")
    table.add_column("evaluation", ratio=1)
    table.add_column("result", justify="right", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    corruptions = report.get("corruptions")
    if corruptions is not None:
        for entry in corruptions.get("per_corruption", []):
            table.add_row(f"{entry['name']}: accuracy, mean of severities", _percent(1 - entry["mean_error"]), "")
        for failure in corruptions["failed"]:
            table.add_row(f"{failure['name']}: failed ({failure['error']})", "", "")
        if corruptions.get("mce") is not None:
            table.add_row("mCE (relative mCE)", f"{_percent(corruptions['mce'])} "
                          f"({_percent(corruptions['relative_mce'])})", "")
    sequences = report.get("sequences")
    if sequences is not None:
        for entry in sequences["results"]:
            table.add_row(f"{entry['name']} sequence: flip probability", _percent(entry["flip_probability"]), "")
        for failure in sequences["failed"]:
            table.add_row(f"{failure['name']} sequence: failed ({failure['error']})", "", "")
    system = report.get("system_noise")
    if system is not None and system["status"] == "failed":
        table.add_row(f"system noise: failed ({system['error']})", "", "")
    elif system is not None:
        table.add_row(f"system noise: accuracy, mean of {len(system['results'])} decoder x resize variants "
                      f"(std {_percent(system['std_accuracy'])})", _percent(system["mean_accuracy"]),
                      _seconds(system["timing"]))
    return table


def _section_rows(table: Table, part: str, section: dict | None, rows: Callable[[dict], list[tuple[str, str]]]) -> None:
    """An optional section's ``rows(section)`` (label, value) below the attacks, then its time."""
    if section is None:
        return
    table.add_section()
    if section["status"] == "failed":
        table.add_row(part, "failed", section.get("error", ""), "", "", "", "")
        return
    for label, value in rows(section):
        table.add_row(label, value, "", "", "", "", "")
    table.add_row(f"{part}: time", "", "", "", "", "", _seconds(section["timing"]))


def _certified_rows(section: dict) -> list[tuple[str, str]]:
    """Verified accuracy per bound and eps (the attacks' rows above are the upper bounds), and
    the smoothed classifier's certified accuracy per radius."""
    rows = [(f"certified {e['method']} {e['norm']} eps={_number(e['eps'])}", _percent(e["verified_accuracy"]))
            for e in section["bounds"]]
    if (smoothing := section["smoothing"]) is not None:
        rows += [(f"certified smoothed sigma={_number(smoothing['sigma'])} l2 r={_number(e['radius'])}",
                  _percent(e["certified_accuracy"])) for e in smoothing["results"]]
    return rows


def _proxies_rows(section: dict) -> list[tuple[str, str]]:
    """Each training-free proxy's mean over the examples."""
    return [(f"proxy {e['name']} (mean)", _number(e["mean"])) for e in section["results"]]


def metrics_table(report: dict) -> Table | None:
    """The 23 metrics (and the additional ones) grouped as the paper groups them, each with
    the direction that means more robust; None when the report has no metrics section."""
    section = report.get("metrics")
    if section is None:
        return None
    table = Table(title="robustness metrics (arXiv 2101.09617)", box=box.SIMPLE_HEAD,
                  caption="better: the direction that means a more robust model (for coverage, a more "
                  "thorough adversarial test set); see report.json for each metric's settings")
    for column, justify in (("#", "right"), ("metric", "left"), ("value", "right"), ("better", "left"),
                            ("description", "left")):
        table.add_column(column, justify=justify, ratio=1 if column == "description" else None)
    if section["status"] == "failed":
        table.add_row("", "metrics", "failed", "", section["error"])
        return table
    group = None
    for entry in section["results"]:
        if entry["group"] != group:
            group = entry["group"]
            table.add_section()
            table.add_row("", "", "", "", f"[bold]{group}[/]")
        value = _number(entry["value"], 4) if entry["status"] == "ok" else entry["status"]
        note = entry["description"] if entry["status"] == "ok" else entry["reason"]
        table.add_row("" if entry["index"] is None else str(entry["index"]), entry["name"], value,
                      entry["direction"], note)
    return table


def sanity_table(report: dict) -> Table | Text | None:
    """The sanity checks against gradient masking that warned, each with what was seen and
    what to do (the caption counts those that passed or were skipped); one line when none
    warned; None when the report has no sanity section."""
    section = report.get("sanity")
    if section is None:
        return None
    table = Table(title="sanity checks against gradient masking", box=box.SIMPLE_HEAD)
    for column in ("check", "seen", "advice"):
        table.add_column(column, ratio=None if column == "check" else 1)
    if section["status"] == "failed":
        table.add_row("sanity checks", "failed", section["error"])
        return table
    verdicts = [check["verdict"] for check in section["checks"]]
    counts = (f"{verdicts.count('pass')} passed, {verdicts.count('warn')} warned, {verdicts.count('skipped')} "
              f"skipped, on {section['num_examples']} correctly classified examples")
    if "warn" not in verdicts:
        return Text(f"sanity checks against gradient masking: {counts}")
    table.caption = f"{counts}; report.json has the values and the literature behind each check"
    for check in section["checks"]:
        if check["verdict"] == "warn":
            table.add_row(f"[yellow]{check['name']}[/]", check["message"], check["advice"])
    return table


def natural_shift_table(report: dict) -> Table | None:
    """One row per released natural-shift set: masked accuracy and calibration (ImageNet-A,
    -R), OOD detection (ImageNet-O, folders), mean accuracy and mCE (ImageNet-C, CIFAR-10-C);
    None when the report has no natural_shift section."""
    section = report.get("natural_shift")
    if section is None:
        return None
    table = Table(title="natural distribution shift", box=box.SIMPLE_HEAD,
                  caption="accuracy on the set's classes (logits masked to them); RMS / ECE: calibration error, "
                  "lower is better; OOD: AUROC / AUPR (OOD positive, score -max softmax), higher is better")
    table.add_column("dataset", ratio=1, min_width=18)
    for column in ("images", "result", "RMS / ECE", "time (s)"):
        table.add_column(column, justify="right", no_wrap=column in ("images", "time (s)"))
    for entry in section["results"]:
        calibration = entry.get("calibration")
        calibrated = "" if calibration is None else (f"{_number(calibration['rms_calibration_error'], 2)} / "
                                                     f"{_number(calibration['expected_calibration_error'], 2)}")
        if entry["kind"] == "ood":
            result = f"AUROC {_percent(entry['auroc'])} AUPR {_percent(entry['aupr'])}"
            label, count = f"{entry['name']}: OOD vs {entry['in_distribution']}", f"{entry['num_ood']} / " \
                f"{entry['num_in_distribution']}"
        elif entry["kind"] == "corruptions":
            mce = "" if entry.get("mce") is None else f", mCE {_percent(entry['mce'])}"
            result = f"accuracy {_percent(entry['mean_accuracy'])}{mce}"
            label = f"{entry['name']}: {len(entry['per_corruption'])} corruptions x " \
                f"{len({r['severity'] for r in entry['results']})} severities"
            count = f"{entry['num_examples']} each"
        else:
            result, label, count = (f"accuracy {_percent(entry['accuracy'])}",
                                    f"{entry['name']} ({entry['num_classes']} classes)", str(entry["num_examples"]))
        table.add_row(label, count, result, calibrated, f"{entry['timing']['wall_s']:.1f}")
    for failure in section["failed"]:
        table.add_row(f"{failure['name']}: failed ({failure['error']})", "", "", "", "")
    return table


TABLES = {"attacks": attack_table, "noise": noise_table, "metrics": metrics_table, "sanity": sanity_table,
          "natural_shift": natural_shift_table}


def finished_sections(report: dict) -> list[str]:
    """The sections of ``report`` (keys of :data:`TABLES`) that are final, so that a running
    evaluation can print each table as soon as it will no longer change."""
    def final(part: str) -> bool:
        return report.get(part) is not None and report[part]["status"] != "running"

    finished = []
    if report["clean"] is not None and len(report["attacks"]) == len(report["plan"]["attacks"]):
        finished.append("attacks")
    planned_noise = [part for part in NOISE_PARTS if report["plan"].get(part) is not None]
    if planned_noise and all(final(part) for part in planned_noise):
        finished.append("noise")
    finished.extend(part for part in ("metrics", "sanity", "natural_shift") if final(part))
    return finished
