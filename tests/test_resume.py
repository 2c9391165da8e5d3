"""Reproducible, resumable evaluations. One plan and seed give bitwise-identical figures
(everything but timing and timestamps) run twice, and across batch sizes in the sections
that draw no random numbers (clean accuracy and calibration, a deterministic attack, a
corruption that ignores its key); random draws are keyed per batch (docs/report-schema.md,
"Determinism"). The item store keeps whole items only and refuses another evaluation's;
`robustjax evaluate` checks its output folder before any work, reuses what a run left, and,
killed with SIGKILL at random moments and rerun, ends with the uninterrupted run's report."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import jax
import numpy as np
import pytest

import robustjax as rj
from robustjax import cli
from robustjax.cli import evaluate as cli_evaluate
from robustjax.evaluation import evaluate, plan_from_dict, resume
from robustjax.evaluation.items import ItemRunner
from robustjax.evaluation.resume import Finished, ItemStore, StoreMismatch, run_item
from robustjax.report import read_report

PLAN = """batch_size = 16
num_examples = 32
seed = 1
[[attacks]]
name = "fgsm"
eps = 0.1
[[attacks]]
name = "pgd"
eps = 0.1
steps = 3
[corruptions]
names = ["gaussian_noise", "brightness"]
severities = [1]
"""
ITEMS = 6  # clean, fgsm, pgd, the two corruptions and the sanity checks
HANG_S = 600  # guards against a hung process only


def figures(report: dict) -> dict:
    """The report without what may differ between identical runs: timing and timestamps."""
    if isinstance(report, dict):
        return {k: figures(v) for k, v in report.items() if k not in ("timing", "created")}
    return [figures(v) for v in report] if isinstance(report, list) else report


def _evaluate(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(["evaluate", *argv])
    return code, capsys.readouterr().err


def _report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


@pytest.fixture(scope="module", autouse=True)
def session_model(digits_clf):
    """In this process the command evaluates the session's digits model (what its default
    `--model digits_cnn` loads; the killed runs load it themselves) instead of building it again."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli_evaluate, "load_model", lambda *args, **kwargs: digits_clf)
        yield


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    (tmp / "plan.toml").write_text(PLAN)
    return tmp


@pytest.fixture(scope="module")
def reference(workdir):
    """The uninterrupted run's report, through the command in this process."""
    assert cli.main(["evaluate", "--plan", str(workdir / "plan.toml"), "--out", str(workdir / "reference")]) == 0
    return _report(workdir / "reference")


def test_a_plan_run_twice_gives_bitwise_identical_figures(reference, workdir, capsys):
    assert _evaluate(capsys, "--plan", str(workdir / "plan.toml"), "--out", str(workdir / "twice"))[0] == 0
    assert figures(_report(workdir / "twice")) == figures(reference)
    assert reference["randomness"]["seed"] == 1 and reference["randomness"]["keys"]["attacks"]
    assert all(reference["environment"][name] for name in ("robustjax", "jax", "jaxlib", "flax", "numpy"))


def test_across_batch_sizes_the_sections_without_random_draws_are_identical(reference, digits_clf):
    plan = plan_from_dict({"batch_size": 24, "num_examples": 32, "seed": 1, "attacks": [{"name": "fgsm", "eps": 0.1}],
                           "corruptions": {"names": ["brightness"], "severities": [1]}})
    report = figures(evaluate(digits_clf, rj.data.digits("test"), plan))
    expected = figures(reference)
    assert (report["randomness"]["batch_size"], expected["randomness"]["batch_size"]) == (24, 16)
    assert report["clean"] == expected["clean"]  # accuracy and calibration, to the last bit
    assert report["attacks"][0] == expected["attacks"][0]  # FGSM
    assert report["corruptions"]["results"] == [r for r in expected["corruptions"]["results"]
                                                if r["name"] == "brightness"]


def test_the_store_keeps_whole_items_and_refuses_another_evaluation(tmp_path):
    folder = tmp_path / "items"
    mask = np.array([True, False, True])
    with ItemStore.open(folder, {"format": resume.STORE_FORMAT, "model": "a"}) as store:
        run_item(store, "clean", lambda: Finished({"accuracy": 0.5}, {"correct": mask}))
        with pytest.raises(ValueError, match="(?i)object arrays cannot be saved"):  # never pickled, and
            store.save("clean", Finished({"accuracy": 0.25}, {"correct": np.array([None])}))
        with pytest.raises(RuntimeError):  # an item that raises is not stored
            run_item(store, "attack-0-fgsm", lambda: (_ for _ in ()).throw(RuntimeError("out of memory")))
        with pytest.raises(OSError, match="another robustjax evaluate is writing"):
            ItemStore.open(folder, {"format": resume.STORE_FORMAT, "model": "a"})
    (folder / ".clean.npz.x.tmp").write_bytes(b"half an item")  # what a killed write leaves
    with ItemStore.open(folder, {"format": resume.STORE_FORMAT, "model": "a"}) as store:
        assert store.names() == ["clean"] and not list(folder.glob("*.tmp"))
        kept = store.load("clean")  # the failed rewrite left the item whole
        assert kept.section == {"accuracy": 0.5} and kept.arrays["correct"].tolist() == mask.tolist()
        assert run_item(store, "clean", lambda: pytest.fail("computed again")).section == kept.section
    with pytest.raises(StoreMismatch, match=r"its model differ from this run's\); rerun with --fresh"):
        ItemStore.open(folder, {"format": resume.STORE_FORMAT, "model": "b"})
    with ItemStore.open(folder, {"format": resume.STORE_FORMAT, "model": "b"}, fresh=True) as store:
        assert store.names() == []


def test_a_store_of_an_older_format_is_refused_with_how_to_start_anew(tmp_path):
    folder = tmp_path / "items"
    folder.mkdir()
    (folder / "fingerprint.json").write_text(json.dumps({"plan": {"seed": 0}, "model": {"name": "digits_cnn"}}))
    with pytest.raises(StoreMismatch, match=r"holds items in an older store format .* rerun with --fresh"):
        ItemStore.open(folder, {"format": resume.STORE_FORMAT, "model": {"name": "digits_cnn"}})


def _read_only(folder: Path) -> Path:
    """A folder that cannot be written, even by root (where chmod alone does not stop it)."""
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK) and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("cannot make a read-only folder here")
    return folder


@pytest.mark.parametrize("problem, message", [
    ("file", "report.txt is a file, not a folder"),
    ("under a file", "report.txt is a file, not a folder"),
    ("read-only", "Permission denied|Operation not permitted"),
    ("full disk", r"MiB free on its disk, the evaluation needs about"),
])
def test_output_folder_problems_are_one_line_before_any_work(problem, message, tmp_path, capsys, monkeypatch):
    (tmp_path / "report.txt").write_text("a user's file")
    out = {"file": tmp_path / "report.txt", "under a file": tmp_path / "report.txt" / "run",
           "read-only": tmp_path / "locked", "full disk": tmp_path / "out"}[problem]
    if problem == "read-only":
        _read_only(out)
    if problem == "full disk":
        monkeypatch.setattr(resume.shutil, "disk_usage", lambda _: types.SimpleNamespace(free=1 << 10))
    monkeypatch.setattr(cli_evaluate, "evaluate", lambda *a, **k: pytest.fail("the evaluation ran before the check"))
    if problem != "full disk":  # a folder that cannot hold results is refused even before the model and data load
        monkeypatch.setattr(cli_evaluate, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
        monkeypatch.setattr(cli_evaluate.data, "load", lambda *a, **k: pytest.fail("the data loaded first"))
    try:
        code, err = _evaluate(capsys, "--plan", "whitebox", "--num-examples", "16", "--out", str(out))
    finally:
        subprocess.run(["chattr", "-i", str(out)], capture_output=True)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert re.search(message, err)
    assert (tmp_path / "report.txt").read_text() == "a user's file"


def test_a_rerun_reuses_the_items_and_after_a_plan_edit_reruns_only_the_edited_ones(reference, workdir, tmp_path,
                                                                                    capsys, monkeypatch, digits_clf):
    out = shutil.copytree(workdir / "reference", tmp_path / "out")
    with monkeypatch.context() as patch:  # nothing is computed again
        patch.setattr(ItemRunner, "records", lambda self, item, *a, **k: pytest.fail(f"{item.kind} ran again"))
        assert _evaluate(capsys, "--plan", str(workdir / "plan.toml"), "--out", str(out))[0] == 0
    resumed = (out / "report.json").read_text()
    assert figures(json.loads(resumed)) == figures(reference)
    edited = tmp_path / "edited.toml"  # PGD with 4 steps instead of 3: one attack item changes
    edited.write_text(PLAN.replace("steps = 3", "steps = 4"))
    ran = []
    with monkeypatch.context() as patch:
        original = ItemRunner.records
        patch.setattr(ItemRunner, "records", lambda self, item, *a, **k: ran.append(item.kind) or original(
            self, item, *a, **k))
        assert _evaluate(capsys, "--plan", str(edited), "--out", str(out))[0] == 0
    assert ran == ["attack"]
    report = _report(out)
    assert report["attacks"][1]["params"]["steps"] == 4
    assert figures(report["attacks"][0]) == figures(reference["attacks"][0])
    assert figures(report["corruptions"]) == figures(reference["corruptions"])
    more = tmp_path / "more.toml"  # a severity added: each corruption runs at it alone
    more.write_text(edited.read_text().replace("severities = [1]", "severities = [1, 3]"))
    ran.clear()
    with monkeypatch.context() as patch:
        patch.setattr(ItemRunner, "records", lambda self, item, *a, **k: ran.append(
            (item.kind, item.settings.get("severity"))) or original(self, item, *a, **k))
        assert _evaluate(capsys, "--plan", str(more), "--out", str(out))[0] == 0
    assert ran == [("corruption", 3), ("corruption", 3)]
    assert [r["accuracy"] for r in _report(out)["corruptions"]["results"] if r["severity"] == 1] == \
        [r["accuracy"] for r in reference["corruptions"]["results"]]
    # other weights of the same shapes: another model, refused unless --fresh
    other = digits_clf.replace(params=jax.tree.map(lambda leaf: leaf * 1.001, digits_clf.params))
    monkeypatch.setattr(cli_evaluate, "load_model", lambda *args, **kwargs: other)
    code, err = _evaluate(capsys, "--plan", str(edited), "--out", str(out))
    assert code == 2 and "holds the results of another evaluation (its model differ" in err and "--fresh" in err
    assert _evaluate(capsys, "--plan", str(edited), "--out", str(out), "--fresh")[0] == 0


def _stored(items: Path) -> dict[str, int]:
    """Item name -> modification time of every item in the store; each must load whole."""
    for path in items.glob("*.npz"):
        with np.load(path, allow_pickle=False) as stored:
            json.loads(str(stored["section"]))
    return {path.stem: path.stat().st_mtime_ns for path in items.glob("*.npz")}


def test_killed_at_random_moments_and_rerun_gives_the_uninterrupted_report(reference, workdir):
    argv = ["evaluate", "--plan", str(workdir / "plan.toml"), "--out", str(workdir / "killed")]
    items = workdir / "killed" / "items"
    env = os.environ | {"ROBUSTJAX_COMPILE_CACHE": str(workdir / "xla")}  # the test's 8 devices, a warm cache
    rng = np.random.default_rng(11)
    kills = 0
    for target in (1, 2):  # killed once `target` items are stored, somewhere inside the next one
        process = subprocess.Popen([sys.executable, "-m", "robustjax.cli", *argv], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while len(list(items.glob("*.npz"))) < target and process.poll() is None:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.4))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait(HANG_S)
    before = _stored(items)
    assert kills == 2 and 2 <= len(before) < ITEMS
    assert read_report(workdir / "killed" / "report.json")["status"] == "killed"  # left "running" by the kill
    (workdir / "killed" / ".report.json.x.tmp").write_text('{"status": ')  # a report write that was killed
    assert cli.main(argv) == 0  # the rerun that completes, in this process
    assert not list((workdir / "killed").glob(".*.tmp"))
    assert figures(_report(workdir / "killed")) == figures(reference)
    after = _stored(items)
    assert len(after) == ITEMS and {name: after[name] for name in before} == before  # reused, not redone
