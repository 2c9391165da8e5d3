import json
import os
import subprocess
import sys

import jax
import jsonschema
import numpy as np
import pytest

from robustjax.cli import main
from robustjax.compile_cache import use_compile_cache
from robustjax.evaluation import default_plan
from robustjax.evaluation.items import CLEAN, attack_item, record_name
from robustjax.report import schema


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_evaluate_writes_a_valid_report(tmp_path, capsys):
    # The digits plan's attacks (its metrics run in the quick-start test below).
    plan = tmp_path / "plan.toml"
    plan.write_text('[[attacks]]\nname = "fgsm"\neps = [0.1, 0.2]\n[[attacks]]\nname = "pgd"\neps = [0.1, 0.2]\n'
                    'steps = 10\n')
    code, out, _ = run(capsys, "evaluate", "--plan", str(plan), "--out", str(tmp_path), "--num-examples", "40")
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    jsonschema.validate(report, schema())
    assert report["model"]["name"] == "digits_cnn" and report["dataset"]["num_examples"] == 40
    assert "pgd linf eps=0.2" in out and "clean" in out and "worst case" in out


def test_model_from_a_python_function(tmp_path, capsys):
    plan = tmp_path / "plan.toml"
    plan.write_text('batch_size = 8\nnum_examples = 8\n[[attacks]]\nname = "fgsm"\neps = 0.1\n[sanity]\nenabled = false\n')
    code, _, err = run(capsys, "evaluate", "--model", "tests.helpers:unnamed_model", "--plan", str(plan),
                       "--out", str(tmp_path))
    assert code == 0, err
    report = json.loads((tmp_path / "report.json").read_text())
    assert [a["name"] for a in report["attacks"]] == ["fgsm"]
    # an unnamed model is named by the spec the user typed; the report says where its weights came from
    assert report["model"]["name"] == "tests.helpers:unnamed_model"
    assert report["model"]["weights"]["source"] == "returned by tests.helpers:unnamed_model"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "resnet_18"], "unknown model 'resnet_18'"),
        (["--model", "tests.helpers:nope"], "cannot load model"),
        (["--model", "tests.helpers:not_a_model"], "must return a robustjax.Classifier"),
        (["--dataset", "imagenet"], "unknown dataset 'imagenet'"),
        (["--plan", "missing.toml"], "no plan file"),
        (["--plan", "whitebox", "--num-examples", "-3"], "num_examples must be an integer >= 1"),
        (["--num-examples", "0"], "num_examples must be an integer >= 1"),
    ],
)
def test_bad_arguments_print_an_error_without_traceback(argv, message, tmp_path, capsys):
    code, _, err = run(capsys, "evaluate", "--out", str(tmp_path), *argv)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "report.json").exists()


def test_compile_cache_can_be_turned_off():
    assert use_compile_cache("off") is None
    assert jax.config.jax_compilation_cache_dir is None


def test_zoo_list(capsys):
    code, out, _ = run(capsys, "zoo", "list")
    assert code == 0 and "digits_cnn" in out


def test_default_evaluation_as_in_the_quick_start(tmp_path):
    """`robustjax evaluate` with no arguments, in a fresh process on the default devices."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "ROBUSTJAX_COMPILE_CACHE")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # where the default compile cache goes
    done = subprocess.run([sys.executable, "-m", "robustjax.cli", "evaluate", "--out", str(tmp_path)],
                          check=True, env=env, capture_output=True, text=True)
    assert any((tmp_path / "cache" / "robustjax" / "xla").iterdir()), "compiled programs are kept for the next run"
    assert "model: structure" in done.stdout and "EBD-2" in done.stdout  # the metrics table, grouped
    report = json.loads((tmp_path / "report.json").read_text())
    jsonschema.validate(report, schema())
    assert report["status"] == "complete" and report["dataset"]["num_examples"] == 500
    clean = report["clean"]["accuracy"]
    assert clean >= 0.95
    strongest = max((a for a in report["attacks"] if a["name"] == "pgd"), key=lambda a: a["params"]["eps"])
    assert strongest["robust_accuracy"] < clean - 0.5
    metrics = {m["name"]: m for m in report["metrics"]["results"]}
    assert {m["index"] for m in metrics.values()} - {None} == set(range(1, 24))
    assert all(m["status"] == "ok" for m in metrics.values())
    # AAW is the PGD eps=0.1 entry's accuracy under attack, from its stored per-example record
    plan = default_plan("digits")
    with np.load(tmp_path / "items" / f"{record_name(plan, attack_item(plan.runs[1]))}.npz") as pgd, \
            np.load(tmp_path / "items" / f"{record_name(plan, CLEAN)}.npz") as clean_item:
        under_attack, clean_correct = ~pgd["success"][1], clean_item["outcome"][0]
    entry = next(a for a in report["attacks"] if a["name"] == "pgd" and a["params"]["eps"] == 0.1)
    assert metrics["AAW"]["settings"]["entry"] == "pgd eps=0.1" and metrics["AAW"]["value"] == under_attack.mean()
    assert entry["robust_accuracy"] == (under_attack & clean_correct).mean()
    assert metrics["mCE"]["value"] == report["corruptions"]["mce"]  # one mCE


def test_metrics_on_a_dataset_without_splits_skip_the_neuron_bounds(tmp_path, capsys):
    import robustjax as rj

    x, y = rj.data.digits("test").arrays(limit=16)
    np.savez(tmp_path / "digits.npz", images=x, labels=y)
    plan = tmp_path / "plan.toml"
    plan.write_text('batch_size = 16\n[sanity]\nenabled = false\n[metrics]\nattack = { name = "fgsm", eps = 0.2 }\nebd_directions = 4\n'
                    'ebd2_step = 0.05\nebd2_max_steps = 5\n')
    code, out, err = run(capsys, "evaluate", "--dataset", str(tmp_path / "digits.npz"), "--plan", str(plan),
                         "--out", str(tmp_path))
    assert code == 0, err
    assert "has no 'train' split" in out
    report = json.loads((tmp_path / "report.json").read_text())
    status = {entry["name"]: entry["status"] for entry in report["metrics"]["results"]}
    assert status["KMNC"] == status["AAB"] == "skipped" and status["TKNC"] == status["CA"] == "ok"
