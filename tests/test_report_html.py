"""report.html: every section rendered from a hand-made report that covers the whole schema,
what an interrupted or partial run's page says, the gallery, `robustjax report`, and the page
opened in a real headless browser (Debian's chromium) with a screenshot kept."""

import copy
import json
import os
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from rich.console import Console

import robustjax as rj
from robustjax import builtin_plans
from robustjax.cli import main
from robustjax.cli import report as cli_report
from robustjax.evaluation import gallery, plan_from_dict
from robustjax.evaluation.plan import create as create_plan
from robustjax.report import html, plots, schema, summary, sweep_html
from robustjax.report.page import escape
from robustjax.sweep import analyze

CHROMIUM = Path("/usr/bin/chromium")
TIMING = {"wall_s": 1.5, "compile_s": 0.5, "images_per_s": 100.0}
GROUPS = [("data: neuron coverage", ["KMNC", "NBC", "SNAC", "TKNC", "TKNP"]),
          ("data: imperceptibility", ["ALD_0", "ALD_2", "ALD_inf", "ASS", "PSD"]),
          ("model: behaviour", ["CA", "AAW", "AAB", "ACAC", "ACTC", "NTE", "RGB", "RIC", "mCE", "relative_mCE"]),
          ("model: structure", ["EBD", "EBD-2", "ENI", "NS", "NU"]),
          ("additional: attack success and defence comparison", ["ASR", "CAV", "CRR", "CSR", "CCV", "COS"])]


def _attack(name: str, params: dict, accuracy: float) -> dict:
    return {"name": name, "params": params, "status": "ok", "robust_accuracy": accuracy, "attack_success_rate": 0.5,
            "num_adversarial": 10, "perturbation": {"linf_mean": 0.1, "l2_mean": 0.7, "l1_mean": 4.0, "l0_mean": 48.0,
                                                    "l2_median": 0.7},
            "queries_mean": 11.0, "queries_median": 11.0, "timing": TIMING}


def _metric(group: str, name: str, index: int | None) -> dict:
    entry = {"name": name, "group": group, "index": index, "direction": "higher" if index and index < 6 else "lower",
             "description": f"definition of {name}", "settings": {"k": 3}, "value": 0.25, "status": "ok"}
    if name == "relative_mCE":
        entry |= {"value": None, "status": "undefined", "reason": "the baseline's error does not exceed its clean error"}
    return entry


def full_report() -> dict:
    """A report with every section the schema has, each finished (and one failed attack)."""
    names, severities = ["gaussian_noise", "brightness"], [1, 2, 3, 4, 5]
    plan = {"batch_size": 64, "num_examples": 64, "seed": 0,
            "attacks": [{"name": "fgsm", "eps": e, "restarts": 1} for e in (0.05, 0.1)]
            + [{"name": "pgd", "norm": "linf", "steps": 10, "eps": e, "restarts": 1} for e in (0.05, 0.1)]
            + [{"name": "pgd", "norm": "l2", "steps": 10, "eps": 1.0, "restarts": 1}, {"name": "deepfool"},
               {"name": "square", "eps": 0.1, "restarts": 1}],
            "corruptions": {"names": names, "severities": severities, "preset": None, "baseline": "alexnet"},
            "sequences": {"names": names, "difficulty": 1, "length": None, "preset": None, "batch_size": 16},
            "system_noise": {"decoders": ["pil", "opencv"], "resizes": ["bilinear", "nearest"], "quality": 95},
            "metrics": {"reference": "digits_mlp"},
            "sanity": {"enabled": True, "num_examples": 32, "steps": 10, "restarts": 4, "eps": None, "grid": 8},
            "natural_shift": {"datasets": ["imagenet-a", "cifar10-c"], "ood": ["folder:/ood"], "data_dir": None,
                              "corruptions": names, "severities": [1, 2], "num_examples": None, "image_size": None},
            "certify": {"bounds": ["ibp", "crown"], "eps": None, "l2_eps": None, "sigma": 0.25, "radii": [0.0, 0.5], "n0": 100,
                        "n": 10000, "alpha": 0.001, "rows_per_pass": 256, "draws_per_pass": 64},
            "proxies": {"names": ["jacobian_norm", "ntk_condition_number"], "iterations": 20}}
    calibration = {"rms_calibration_error": 0.1, "expected_calibration_error": 0.08, "aurra": 0.7}
    shift_entries = [
        {"name": "imagenet-a", "kind": "classification", "source": "tfds:imagenet_a/test", "num_examples": 7500,
         "num_classes": 200, "accuracy": 0.03, "calibration": calibration, "timing": TIMING},
        {"name": "cifar10-c", "kind": "corruptions", "source": "/data/CIFAR-10-C", "num_examples": 10000,
         "num_classes": 10, "results": [{"name": n, "family": "noise", "severity": s, "accuracy": 0.8, "error": 0.2}
                                        for n in names for s in (1, 2)],
         "mean_accuracy": 0.8, "per_corruption": [{"name": n, "family": "noise", "mean_error": 0.2} for n in names],
         "mean_error": 0.2, "mce": None, "relative_mce": None, "calibration": calibration, "timing": TIMING},
        {"name": "folder:/ood", "kind": "ood", "source": "/ood", "in_distribution": "digits/test", "num_ood": 50,
         "num_in_distribution": 64, "num_classes": 10, "auroc": 0.8, "aupr": 0.7, "fpr_at_95_tpr": 0.4,
         "timing": TIMING}]
    attacks = [_attack("fgsm", {"eps": 0.05, "restarts": 1}, 0.9), _attack("fgsm", {"eps": 0.1, "restarts": 1}, 0.7),
               _attack("pgd", {"eps": 0.05, "norm": "linf", "steps": 10, "restarts": 1}, 0.8),
               _attack("pgd", {"eps": 0.1, "norm": "linf", "steps": 10, "restarts": 1}, 0.4),
               _attack("pgd", {"eps": 1.0, "norm": "l2", "steps": 10, "restarts": 1}, 0.5),
               _attack("deepfool", {"steps": 50, "restarts": 1}, 0.0),
               {"name": "square", "params": {"eps": 0.1, "restarts": 1}, "status": "failed",
                "error": "RuntimeError: out of memory"}]
    per_corruption = [{"name": n, "family": "noise", "mean_error": 0.3, "ce": 0.5, "relative_ce": 0.6} for n in names]
    indices = [1, 2, 3, 4, 5, 6, 6, 6, *range(7, 24), *[None] * 6]  # the three ALD entries share 6
    metrics = [_metric(group, name, index) for index, (group, name) in zip(
        indices, [(group, name) for group, names in GROUPS for name in names], strict=True)]
    checks = [{"name": "input_gradients", "verdict": "pass", "value": {"vanishing": 0}, "message": "every gradient is finite",
               "advice": "none needed", "reference": "Athalye et al. 2018"},
              {"name": "unbounded_pgd", "verdict": "warn", "value": {"accuracy": 0.2},
               "message": "PGD with the whole box leaves 20% correct", "advice": "look for gradient masking",
               "reference": "Carlini et al. 2019"},
              {"name": "restarts_converged", "verdict": "skipped", "value": None, "reason": "no restarts",
               "message": "skipped", "advice": "", "reference": "AutoAttack"}]
    count = [0] * 12 + [2, 6, 56]
    return {
        "schema_version": 6, "status": "incomplete", "created": "2026-01-01T00:00:00+00:00",
        "model": {"name": "digits_cnn", "num_classes": 10, "input_shape": [8, 8, 1], "num_params": 188234},
        "dataset": {"name": "digits/test", "num_examples": 64}, "plan": plan,
        "environment": {"robustjax": "0.1.0", "jax": "0.10.2", "jaxlib": "0.10.2", "flax": "0.12.8", "numpy": "2.4.6",
                        "python": "3.11.7", "backend": "cpu", "device_kind": "cpu", "device_count": 1},
        "randomness": {"seed": 0, "prng_impl": "threefry2x32", "threefry_partitionable": True, "batch_size": 64,
                       "keys": {"clean": None, "attacks": "fold_in(key(seed), b)"}},
        "clean": {"accuracy": 0.98, "num_correct": 63, "timing": TIMING,
                  "calibration": {"rms_calibration_error": 0.02, "expected_calibration_error": 0.015, "aurra": 0.99,
                                  "reliability": {"count": count,
                                                  "confidence": [None] * 12 + [0.85, 0.93, 0.99],
                                                  "accuracy": [None] * 12 + [0.5, 0.83, 1.0]}}},
        "attacks": attacks,
        "worst_case": [{"norm": "linf", "eps": e, "attacks": ["fgsm", "pgd"], "robust_accuracy": a, "wcar": a}
                       for e, a in ((0.05, 0.78), (0.1, 0.35))],
        "corruptions": {"status": "ok", **plan["corruptions"], "preset": "cifar", "failed": [],
                        "results": [{"name": n, "family": "noise", "severity": s, "accuracy": 1 - 0.1 * s,
                                     "error": 0.1 * s} for n in names for s in severities],
                        "per_corruption": per_corruption, "mean_error": 0.3, "mean_error_by_family": {"noise": 0.3},
                        "mce": 0.5, "relative_mce": 0.6, "timing": TIMING},
        "sequences": {"status": "ok", **plan["sequences"], "preset": "cifar", "failed": [],
                      "results": [{"name": n, "family": "noise", "flip_probability": 0.1, "top5_distance": 0.2}
                                  for n in names],
                      "mean_flip_probability": 0.1, "mean_top5_distance": 0.2, "timing": TIMING},
        "system_noise": {"status": "ok", **plan["system_noise"],
                         "results": [{"decoder": d, "resize": r, "accuracy": 0.9} for d in ("pil", "opencv")
                                     for r in ("bilinear", "nearest")],
                         "mean_accuracy": 0.9, "std_accuracy": 0.0, "negative_std": -0.0, "timing": TIMING},
        "metrics": {"status": "ok", "settings": {"reference": "digits_mlp"},
                    "results": metrics, "timing": TIMING},
        "sanity": {"status": "ok", "settings": {"enabled": True, "eps": 0.1}, "num_examples": 32, "num_warnings": 1,
                   "checks": checks, "timing": TIMING},
        "natural_shift": {"status": "ok", "settings": plan["natural_shift"], "results": shift_entries, "failed": [],
                          "timing": {"wall_s": 1.0, "compile_s": 0.5}},
        "certified": {"status": "ok", **plan["certify"], "eps": [0.05, 0.1],
                      "l2_eps": [],
                      "bounds": [{"method": m, "norm": "linf", "eps": e, "verified_accuracy": v}
                                 for m, e, v in (("ibp", 0.05, 0.1), ("ibp", 0.1, 0.0), ("crown", 0.05, 0.6),
                                                 ("crown", 0.1, 0.2))],
                      "intervals": [{"norm": "linf", "eps": e, "certified": c, "attacked": a, "width": a - c,
                                     "attacks": ["fgsm", "pgd"], "contradictions": 0}
                                    for e, c, a in ((0.05, 0.6, 0.78), (0.1, 0.2, 0.35))],
                      "smoothing": {"sigma": 0.25, "n0": 100, "n": 10000, "alpha": 0.001,
                                    "results": [{"radius": 0.0, "certified_accuracy": 0.9},
                                                {"radius": 0.5, "certified_accuracy": 0.4}]},
                      "timing": TIMING},
        "proxies": {"status": "ok", **plan["proxies"], "timing": TIMING,
                    "results": [{"name": "jacobian_norm", "mean": 3.5, "median": 3.1},
                                {"name": "ntk_condition_number", "mean": 250.0, "median": 250.0}]},
    }


def interrupted_report() -> dict:
    """The full report's run interrupted during the corruptions: one attack entry and the
    later sections missing, the corruptions partial."""
    report = full_report()
    report["status"] = "interrupted"
    report["attacks"] = report["attacks"][:6]
    report["corruptions"] |= {"status": "running", "results": report["corruptions"]["results"][:5]}
    for part in ("per_corruption", "mean_error", "mean_error_by_family", "mce", "relative_mce", "timing"):
        del report["corruptions"][part]
    report.update(sequences=None, system_noise=None, metrics=None, sanity=None, natural_shift=None)
    return report


def hand_gallery(num: int = 3) -> dict:
    rng = np.random.default_rng(0)
    clean = rng.uniform(size=(num, 8, 8, 1)).astype(np.float32)
    out = {"label": np.arange(num, dtype=np.int32), "attack": np.array("pgd linf eps=0.1"),
           "corruption": np.array("brightness severity 3")}
    for kind, images in (("clean", clean), ("adversarial", np.clip(clean + 0.1, 0, 1)), ("corrupted", clean / 2)):
        out |= {kind: images, f"{kind}_prediction": np.arange(num, dtype=np.int32)[::-1].copy(),
                f"{kind}_confidence": np.full(num, 0.9, np.float32)}
    return out


def sections(page: str) -> dict[str, str]:
    """Each section's HTML by its id."""
    return dict(re.findall(r"<section id=(\w+)>(.*?)</section>", page, flags=re.S))


def test_the_hand_made_reports_satisfy_the_schema():
    jsonschema.validate(full_report(), schema())
    jsonschema.validate(interrupted_report(), schema())


def test_every_section_is_rendered_from_a_full_report():
    page = html.render_html(full_report(), hand_gallery())
    parts = sections(page)
    assert list(parts) == list(html.SECTIONS)
    assert "Missing" not in page and "Not in this plan" not in page and "Partial" not in page
    assert parts["summary"].count("worst-case robust accuracy") == 3  # linf 0.05 and 0.1 (per example), l2 1.0
    assert "35.0%" in parts["summary"] and "unbounded_pgd" in parts["summary"] and "square" in parts["summary"]
    assert "worst case over attacks" in parts["attacks"] and "out of memory" in parts["attacks"]
    for part in ("attacks", "corruptions", "sequences", "system_noise", "calibration"):
        assert parts[part].count("<svg") == 1, part
    assert "mCE 50.0%" in parts["corruptions"] and "CE (vs alexnet)" in parts["corruptions"]
    assert parts["natural_shift"].count("<svg") == 2 and "FPR at 95% TPR" in parts["natural_shift"]
    for group, names in GROUPS:
        assert f"<h3>{group}</h3>" in parts["metrics"]
        assert all(f"<td>{escape(name)}</td>" in parts["metrics"] for name in names)
    assert "&uarr;&nbsp;higher" in parts["metrics"] and "&darr;&nbsp;lower" in parts["metrics"]
    assert "the baseline&#x27;s error does not exceed" in parts["metrics"]  # the reason of an undefined metric
    assert parts["gallery"].count("<img") == 3 * 4 and "perturbation, magnified" in parts["gallery"]
    assert "threefry2x32" in parts["reproduce"] and "0.10.2" in parts["reproduce"]
    assert '&quot;attacks&quot;' in parts["reproduce"]  # the plan as run


@pytest.mark.parametrize("name", builtin_plans.evaluation_plans())
def test_the_plan_on_the_page_runs_again_as_the_same_plan(name):
    """The report keeps a plan as ``as_dict`` writes it (one entry per epsilon, nulls); the
    page's JSON reads back into the plan that ran, epsilon sweeps included."""
    plan = create_plan(name)
    shown = html.runnable_plan(json.loads(json.dumps(plan.as_dict())))
    assert plan_from_dict(json.loads(json.dumps(shown))) == plan
    section = html._reproduce({"schema_version": 1, "plan": plan.as_dict()}, None)
    assert f"<td>attack: {shown['attacks'][0]['name']}</td>" in section and escape(json.dumps(shown, indent=2)) in section


def test_an_epsilon_grids_time_is_shown_once_on_its_first_row():
    """One pass evaluates PGD at both epsilons: the page and the console give its time once."""
    report = full_report()
    grid = {**TIMING, "wall_s": 7.3, "grid_size": 2}
    for entry in report["attacks"]:
        if entry["name"] == "pgd" and entry["params"]["norm"] == "linf":
            entry["timing"] = grid
    attacks = sections(html.render_html(report))["attacks"]
    assert attacks.count("<td class=num>7.3</td>") == 1 and attacks.count("<td class=num>1.5</td>") >= 3
    console = Console(width=200, record=True)
    console.print(summary.attack_table(report))
    assert console.export_text().count("7.3 (0.5)") == 1


def test_the_worst_case_is_drawn_beneath_the_attack_it_equals():
    """A worst case equal to one attack's line must not hide that line: its band comes first."""
    line = ([0.1, 0.2], [0.5, 0.2])
    svg = plots.robust_accuracy({"linf": [("pgd", *line), ("worst case", *line)]}, clean_accuracy=0.9)
    band, attack = svg.find("stroke-width: 7"), svg.find("stroke-width: 1.5")
    assert 0 <= band < attack


def test_the_page_is_self_contained_and_the_same_every_time():
    page = html.render_html(full_report(), hand_gallery())
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page) and "<script" not in page and "<link" not in page
    assert page == html.render_html(full_report(), hand_gallery())


def test_an_interrupted_run_says_which_sections_are_missing():
    parts = sections(html.render_html(interrupted_report()))
    for part in ("sequences", "system_noise", "metrics", "sanity"):
        assert "Missing: the run was interrupted before it." in parts[part], part
    assert "Partial: the run was interrupted before this section finished" in parts["corruptions"]
    assert "<svg" in parts["corruptions"]  # what it measured is still drawn
    assert "1 of the plan's 7 attack entries are absent" in parts["attacks"]
    assert "Perturbation sequences (ImageNet-P); System noise" in parts["summary"]
    assert "No gallery" in parts["gallery"]


def test_sections_the_plan_leaves_out_and_a_run_still_going():
    report = interrupted_report()
    report["plan"].update(sequences=None, system_noise=None)
    report["plan"]["sanity"]["enabled"] = False
    report["status"] = "running"
    parts = sections(html.render_html(report))
    for part in ("sequences", "system_noise", "sanity"):
        assert "Not in this plan." in parts[part], part
    assert "Not computed yet: the run was still going" in parts["metrics"]
    report["status"] = "failed"
    report["error"] = "RuntimeError: a bug"
    parts = sections(html.render_html(report))
    assert "Missing: the run failed before it." in parts["metrics"] and "RuntimeError: a bug" in parts["summary"]


def test_failed_sections_show_their_error_and_old_reports_have_no_diagram():
    report = full_report()
    report["system_noise"] = {"status": "failed", **report["plan"]["system_noise"], "error": "ImportError: no av"}
    report["metrics"] = {"status": "failed", "settings": {}, "error": "ValueError: no reference"}
    del report["clean"]["calibration"]["reliability"]
    jsonschema.validate(report, schema())
    parts = sections(html.render_html(report))
    assert "Failed: ImportError: no av" in parts["system_noise"] and "Failed: ValueError" in parts["metrics"]
    assert "<svg" not in parts["calibration"] and "no per-bin calibration data" in parts["calibration"]


def test_text_from_the_report_is_escaped():
    report = full_report()
    report["model"]["name"] = "<script>alert(1)</script>"
    page = html.render_html(report)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_the_strongest_attack_of_a_plan():
    plan = plan_from_dict({"attacks": [{"name": "fgsm", "eps": [0.1, 0.3]},
                                       {"name": "pgd", "norm": "l2", "eps": 2.0, "steps": 3},
                                       {"name": "pgd", "norm": "linf", "eps": [0.1, 0.3], "steps": 3}]})
    attack, label = gallery.strongest_attack(plan)
    assert (attack.name, attack.norm, attack.eps, label) == ("pgd", "linf", 0.3, "pgd linf eps=0.3")
    assert gallery.strongest_attack(plan_from_dict({"attacks": []})) is None


def test_the_gallery_of_a_plan_saved_without_pickles(tmp_path):
    plan = plan_from_dict({"attacks": [{"name": "fgsm", "eps": 0.2}], "num_examples": 4,
                           "corruptions": {"names": ["brightness"], "severities": [1, 5]}})
    arrays = gallery.gallery(rj.zoo.load("digits_cnn"), rj.data.digits("test"), plan)
    x, y = rj.data.digits("test").arrays(limit=4)
    np.testing.assert_array_equal(arrays["clean"], x)
    np.testing.assert_array_equal(arrays["label"], y)
    assert np.abs(arrays["adversarial"] - x).max() <= 0.2 + 1e-6 and str(arrays["corruption"]) == "brightness severity 5"
    assert {arrays[f"{kind}_prediction"].shape for kind in ("clean", "adversarial", "corrupted")} == {(4,)}
    gallery.save(tmp_path / gallery.FILE, arrays)
    with np.load(tmp_path / gallery.FILE, allow_pickle=False) as loaded:
        assert sorted(loaded) == sorted(arrays)
    assert gallery.load(tmp_path / "absent.npz") is None


def test_report_command_writes_the_html_and_refuses_a_newer_schema(tmp_path, capsys):
    (tmp_path / "report.json").write_text(json.dumps(interrupted_report()))
    gallery.save(tmp_path / gallery.FILE, hand_gallery())
    assert main(["report", str(tmp_path)]) == 0
    assert "report.html" in capsys.readouterr().out
    page = (tmp_path / "report.html").read_text()
    assert "Missing: the run was interrupted before it." in page and "perturbation, magnified" in page
    assert main(["report", str(tmp_path / "report.json"), "--html", str(tmp_path / "out" / "page.html")]) == 0
    assert (tmp_path / "out" / "page.html").read_text() == page
    newer = copy.deepcopy(full_report()) | {"schema_version": 99}
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "report.json").write_text(json.dumps(newer))
    assert main(["report", str(tmp_path / "new")]) == 2
    assert "schema version 99, newer than this robustjax reads" in capsys.readouterr().err
    assert not (tmp_path / "new" / "report.html").exists()


# A probe added to a copy of the page: it records errors and console errors from the start,
# and after the load event writes the headings and every figure's size into the DOM.
PROBE_HEAD = """<script>window.__errors = [];
addEventListener('error', e => __errors.push(String(e.message || (e.target && e.target.outerHTML.slice(0, 80)))), true);
const __error = console.error; console.error = (...a) => { __errors.push(a.join(' ')); __error(...a); };</script>"""
PROBE_BODY = """<script>addEventListener('load', () => {
  const figures = [...document.querySelectorAll('section svg, section img')].map(f => {
    const r = f.getBoundingClientRect(); return {tag: f.tagName, width: r.width, height: r.height,
      decoded: f.tagName !== 'IMG' || (f.complete && f.naturalWidth > 0)}; });
  const headings = [...document.querySelectorAll('section')].map(s => [s.id, s.querySelector('h2').innerText]);
  const out = document.createElement('pre'); out.id = 'probe';
  out.textContent = JSON.stringify({errors: __errors, figures, headings});
  document.body.appendChild(out); });</script>"""


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars", "--disable-dev-shm-usage",
                           f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.parametrize("which", ["full", "interrupted"])
def test_the_page_renders_in_a_headless_browser(which, tmp_path):
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium; .ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    report, arrays = (full_report(), hand_gallery()) if which == "full" else (interrupted_report(), None)
    page = tmp_path / "report.html"
    html.write_html(page, report, arrays)
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</head>", PROBE_HEAD + "</head>").replace("</body>",
                                                                                        PROBE_BODY + "</body>"))
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom", probed.as_uri(), profile=tmp_path / "profile").stdout
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, flags=re.S)
    assert found, f"the probe did not run; the browser returned {dom[:500]!r}"
    probe = json.loads(found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                       .replace("&amp;", "&"))
    assert probe["errors"] == []
    assert [id_ for id_, _ in probe["headings"]] == list(html.SECTIONS)
    assert [title for _, title in probe["headings"]] == list(html.SECTIONS.values())
    expected = {"full": 7 + 3 * 4, "interrupted": 3}[which]  # figures (natural shift: 2), and the gallery's images
    assert len(probe["figures"]) == expected
    assert all(f["width"] > 0 and f["height"] > 0 and f["decoded"] for f in probe["figures"]), probe["figures"]
    screenshot = tmp_path / f"report-{which}.png"
    _chromium("--window-size=1200,2400", f"--screenshot={screenshot}", page.as_uri(), profile=tmp_path / "profile")
    assert screenshot.stat().st_size > 10_000
    if artefacts := os.environ.get("ROBUSTJAX_TEST_ARTEFACTS"):
        Path(artefacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, artefacts)
        shutil.copy(page, Path(artefacts) / f"report-{which}.html")


def sweep_table() -> analyze.Table:
    rng = np.random.default_rng(0)
    rows = [{"arch_id": f"net{i}", "params": int(1e4 * (i + 1)), "flops": int(1e6 * (i + 1)), "width": 8 * (i % 2 + 1),
             "clean": float(rng.uniform(0.8, 1)), "pgd eps=0.1": float(rng.uniform(0, 0.5)),
             "gaussian_noise s3": float(rng.uniform(0.5, 0.9)) if i else None} for i in range(5)]
    return analyze.Table(rows=rows, dimensions=("width",), figures=("clean", "pgd eps=0.1", "gaussian_noise s3"))


def test_a_sweep_database_renders_its_analysis_page(tmp_path, monkeypatch, capsys):
    """`robustjax report DB.sqlite` draws analyze's plots of robustness against FLOPs and
    parameters and of the rank correlations (the database read is stubbed: its layout is the
    sweep store's to test)."""
    page = sweep_html.render_sweep_html(sweep_table(), "robustjax sweep: s.sqlite")
    assert page.count("<svg") == 3 and "Robustness against flops" in page and "Robustness against params" in page
    assert "Rank correlations between noise types" in page and "<td>pgd eps=0.1</td><td>gaussian_noise s3</td>" in page
    database = tmp_path / "s.sqlite"
    sqlite3.connect(database).execute("create table t (x)").connection.close()
    monkeypatch.setattr(cli_report.Store, "read", lambda path: path)
    monkeypatch.setattr(cli_report.export, "table", lambda store: sweep_table() if store == database else None)
    assert main(["report", str(database)]) == 0
    assert "5 networks written to" in capsys.readouterr().out
    assert (tmp_path / "s.html").read_text() == page
    with pytest.raises(ValueError, match="correlations need at least 2"):
        sweep_html.render_sweep_html(analyze.Table(rows=sweep_table().rows[:1], dimensions=(), figures=("clean",)), "")
