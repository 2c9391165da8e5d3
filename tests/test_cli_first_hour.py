"""A newcomer's mistakes and interruptions on the command line: one clear line each, exit
code 2 (130 when interrupted), and a report that says how far the run got."""

import json
import os
import re
import signal
import subprocess
import sys

import jax
import jsonschema
import numpy as np
import pytest
from PIL import Image

from robustjax import zoo
from robustjax.cli import evaluate as cli_evaluate
from robustjax.cli import main, parser
from robustjax.evaluation import runner
from robustjax.evaluation.resume import ItemStore
from robustjax.report import read_report, schema

ONE_FGSM = 'batch_size = 8\nnum_examples = 8\n[[attacks]]\nname = "fgsm"\neps = 0.1\n'


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(capsys, *argv) -> str:
    code, _, err = run(capsys, *argv)
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture
def plan(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(ONE_FGSM + "[sanity]\nenabled = false\n")
    return path


def test_help_lists_every_built_in_plan_without_importing_jax():
    code = ("import sys\nfrom robustjax.cli import parser\ntext = parser().format_help() + "
            "parser()._subparsers._group_actions[0].choices['evaluate'].format_help()\n"
            "print(text)\nprint('jax imported' if 'jax' in sys.modules else 'no jax')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().endswith("no jax")
    for name in ("autoattack", "default", "digits", "whitebox"):
        assert name in done.stdout


def test_a_text_file_named_npz_is_named_in_one_line(tmp_path, plan, capsys):
    (tmp_path / "x.npz").write_text("hello\n")
    err = one_line_error(capsys, "evaluate", "--dataset", str(tmp_path / "x.npz"), "--plan", str(plan),
                         "--out", str(tmp_path / "out"))
    assert "x.npz" in err and "pickle" not in err


def test_corrupted_weights_are_one_line_without_orbaxs_closed_loop_tracebacks(tmp_path):
    from robustjax.zoo.weights import save_weights

    save_weights(tmp_path / "run" / "weights", zoo.create("digits_mlp").params)
    (tmp_path / "run" / "card.json").write_text(json.dumps({"name": "digits_mlp", "num_classes": 10}))
    chunks = [p for p in (tmp_path / "run" / "weights").rglob("*") if p.is_file() and p.parent.name == "d"]
    for chunk in chunks:
        chunk.write_bytes(b"\0" * 100)  # truncated and overwritten
    done = subprocess.run([sys.executable, "-m", "robustjax.cli", "evaluate", "--model", "digits_mlp", "--weights",
                           str(tmp_path / "run"), "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert chunks and done.returncode == 2
    assert done.stderr.startswith("error: ") and "is not a weights checkpoint orbax can read" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_labels_outside_the_models_classes_give_the_models_range(tmp_path, plan, capsys):
    images = np.random.default_rng(0).uniform(size=(6, 8, 8, 1)).astype(np.float32)
    np.savez(tmp_path / "badlab.npz", x=images, y=np.array([-1, 10, 0, 1, 2, 3]))
    err = one_line_error(capsys, "evaluate", "--dataset", str(tmp_path / "badlab.npz"), "--plan", str(plan),
                         "--out", str(tmp_path / "out"))
    assert "[0, 10)" in err and "-1" in err and "10 (1 label)" in err


def test_a_zoo_model_without_weights_names_the_command_line_options(tmp_path, capsys):
    err = one_line_error(capsys, "evaluate", "--model", "resnet18", "--out", str(tmp_path))
    assert "--weights DIR" in err and "--random-weights" in err and "pretrained=False" not in err


def test_random_weights_replace_the_bundled_ones():
    random = cli_evaluate.load_model(parser().parse_args(["evaluate", "--random-weights"]))
    trained = cli_evaluate.load_model(parser().parse_args(["evaluate"]))
    assert random.name == trained.name
    assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(random.params), jax.tree.leaves(trained.params)))


def test_an_unprepared_tfds_dataset_names_the_command_that_prepares_it(tmp_path, capsys):
    err = one_line_error(capsys, "evaluate", "--dataset", "tfds:mnist", "--data-dir", str(tmp_path / "tfds"),
                         "--out", str(tmp_path / "out"))
    assert "tfds build mnist" in err


def test_a_folder_of_grey_images_loads_with_the_models_one_channel(tmp_path, plan, capsys):
    rng = np.random.default_rng(0)
    for label in range(2):
        (tmp_path / "images" / str(label)).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8), mode="L").save(
                tmp_path / "images" / str(label) / f"{i}.png")
    code, out, err = run(capsys, "evaluate", "--dataset", str(tmp_path / "images"), "--plan", str(plan),
                         "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert read_report(tmp_path / "out" / "report.json")["dataset"]["num_examples"] == 8


def _interrupted_in_sanity(monkeypatch, interrupt):
    """The sanity checks (the plan's last section) are interrupted by ``interrupt()``."""
    def sanity_section(*args, **kwargs):
        interrupt()
        pytest.fail("not interrupted")

    monkeypatch.setattr(runner.sanity, "sanity_section", sanity_section)


@pytest.mark.parametrize("interrupt", ["ctrl-c", "sigterm"])
def test_an_interrupted_run_prints_its_finished_tables_and_leaves_an_interrupted_report(
        interrupt, tmp_path, capsys, monkeypatch):
    """The attack table is printed as soon as the attacks finish, before the interruption."""
    def ctrl_c():
        raise KeyboardInterrupt

    def sigterm():
        os.kill(os.getpid(), signal.SIGTERM)

    _interrupted_in_sanity(monkeypatch, {"ctrl-c": ctrl_c, "sigterm": sigterm}[interrupt])
    handler = signal.getsignal(signal.SIGTERM)
    (tmp_path / "plan.toml").write_text(ONE_FGSM)
    code, out, err = run(capsys, "evaluate", "--plan", str(tmp_path / "plan.toml"), "--out", str(tmp_path / "out"))
    assert code == 130 and "Traceback" not in err
    assert "fgsm eps=0.1" in out  # the attack table
    assert re.search(r"interrupted: 2 finished item\(s\) are kept in .*; rerun the same command to resume", out)
    report = read_report(tmp_path / "out" / "report.json")
    jsonschema.validate(report, schema())
    assert report["status"] == "interrupted" and [a["name"] for a in report["attacks"]] == ["fgsm"]
    assert report["sanity"] is None
    assert "Missing: the run was interrupted before it." in (tmp_path / "out" / "report.html").read_text()
    assert not (tmp_path / "out" / "gallery.npz").exists()
    assert signal.getsignal(signal.SIGTERM) is handler  # the command's own handler is gone


def test_a_failing_evaluation_leaves_a_failed_report_with_its_error(tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(runner, "clean_section", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["evaluate", "--plan", "whitebox", "--num-examples", "8", "--out", str(tmp_path)])
    report = read_report(tmp_path / "report.json")
    assert report["status"] == "failed" and report["error"] == "RuntimeError: a bug"
    jsonschema.validate(report, schema())


def test_a_report_left_running_reads_as_killed_once_its_writer_is_gone(tmp_path, capsys):
    (tmp_path / "report.json").write_text(json.dumps({"schema_version": 5, "status": "running"}))
    assert read_report(tmp_path / "report.json")["status"] == "running"  # no item store: nothing to tell
    with ItemStore.open(tmp_path / "items", {"plan": 1}):
        assert read_report(tmp_path / "report.json")["status"] == "running"  # its writer holds the store
    assert read_report(tmp_path / "report.json")["status"] == "killed"


def test_report_prints_the_tables_and_the_runs_end(tmp_path, plan, capsys):
    assert main(["evaluate", "--plan", str(plan), "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert (tmp_path / "gallery.npz").is_file() and "perturbation, magnified" in (tmp_path / "report.html").read_text()
    (tmp_path / "report.html").unlink()
    code, out, _ = run(capsys, "report", str(tmp_path))
    assert code == 0 and "fgsm eps=0.1" in out and "report.json: complete" in out
    assert "perturbation, magnified" in (tmp_path / "report.html").read_text()  # rendered again, with the gallery


def test_a_report_of_a_newer_schema_is_refused(tmp_path, capsys):
    (tmp_path / "report.json").write_text(json.dumps({"schema_version": 99, "status": "complete"}))
    err = one_line_error(capsys, "report", str(tmp_path / "report.json"))
    assert "schema version 99, newer than this robustjax reads" in err


def test_zoo_list_fits_80_columns_and_keeps_each_description_whole(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(capsys, "zoo", "list")
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    flowing = " ".join(out.split())
    for name in zoo.names():
        assert " ".join(zoo.get(name).description.replace("``", "").split()) in flowing, name
