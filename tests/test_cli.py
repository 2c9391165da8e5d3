import json
import os
import subprocess
import sys

import jsonschema
import pytest

from robustjax.cli import main
from robustjax.report import schema


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_evaluate_writes_a_valid_report(tmp_path, capsys):
    code, out, _ = run(capsys, "evaluate", "--out", str(tmp_path), "--num-examples", "40")
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    jsonschema.validate(report, schema())
    assert report["model"]["name"] == "digits_cnn" and report["dataset"]["num_examples"] == 40
    assert "pgd linf eps=0.2" in out and "clean" in out
    assert "model: structure" in out and "EBD-2" in out  # the metrics table, grouped


def test_model_from_a_python_function(tmp_path, capsys):
    plan = tmp_path / "plan.toml"
    plan.write_text('batch_size = 8\nnum_examples = 8\n[[attacks]]\nname = "fgsm"\neps = 0.1\n')
    code, _, err = run(capsys, "evaluate", "--model", "tests.helpers:tiny_model", "--plan", str(plan),
                       "--out", str(tmp_path))
    assert code == 0, err
    report = json.loads((tmp_path / "report.json").read_text())
    assert [a["name"] for a in report["attacks"]] == ["fgsm"]


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


def test_zoo_list(capsys):
    code, out, _ = run(capsys, "zoo", "list")
    assert code == 0 and "digits_cnn" in out


def test_default_evaluation_as_in_the_quick_start(tmp_path):
    """`robustjax evaluate` with no arguments, in a fresh process on the default devices."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    subprocess.run([sys.executable, "-m", "robustjax.cli", "evaluate", "--out", str(tmp_path)],
                   check=True, env=env, capture_output=True, timeout=600)
    report = json.loads((tmp_path / "report.json").read_text())
    jsonschema.validate(report, schema())
    assert report["status"] == "complete" and report["dataset"]["num_examples"] == 500
    clean = report["clean"]["accuracy"]
    assert clean >= 0.95
    strongest = max((a for a in report["attacks"] if a["name"] == "pgd"), key=lambda a: a["params"]["eps"])
    assert strongest["robust_accuracy"] < clean - 0.5
    metrics = report["metrics"]["results"]
    assert {m["index"] for m in metrics} - {None} == set(range(1, 24))
    assert all(m["status"] == "ok" for m in metrics)
