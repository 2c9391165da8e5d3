"""Every loading path of the command line meets a damaged file with one line naming the
file and exit 2, never a traceback: a text file, random bytes, an empty file and a real
file cut in half, as a plan, a dataset, a report, a sweep database, a PyTorch checkpoint
and a weights folder's place."""

import json
import sqlite3

import numpy as np
import pytest

from robustjax.cli import main

PLAN = 'batch_size = 8\nnum_examples = 8\n[[attacks]]\nname = "fgsm"\neps = 0.1\n[sanity]\nenabled = false\n'


def _real_plan(path):
    path.write_text(PLAN)


def _real_dataset(path):
    rng = np.random.default_rng(0)
    np.savez(path, images=rng.integers(0, 256, (8, 8, 8, 1), dtype=np.uint8), labels=np.arange(8))


def _real_report(path):
    path.write_text(json.dumps({"schema_version": 5, "status": "complete", "model": {"name": "digits_cnn"},
                                "attacks": [{"name": "fgsm", "eps": 0.1, "robust_accuracy": 0.5}] * 20}))


def _real_database(path):
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.executemany("INSERT INTO meta VALUES (?, ?)", [(f"k{i}", "v" * 200) for i in range(200)])


def _real_checkpoint(path):
    import torch

    torch.save({"conv.weight": torch.zeros(4, 1, 3, 3), "fc.weight": torch.zeros(10, 16)}, path)


# name: (file name, how a real one is written, the command given the file)
PATHS = {
    "plan": ("plan.toml", _real_plan, lambda f, tmp: ["plan", "check", str(f)]),
    "dataset": ("set.npz", _real_dataset, lambda f, tmp: ["evaluate", "--dataset", str(f), "--plan",
                                                          str(tmp / "ok.toml"), "--out", str(tmp / "out")]),
    "report": ("report.json", _real_report, lambda f, tmp: ["report", str(f)]),
    "database": ("sweep.sqlite", _real_database, lambda f, tmp: ["sweep", "status", "--db", str(f)]),
    "checkpoint": ("model.pth", _real_checkpoint, lambda f, tmp: ["zoo", "convert", "resnet20_cifar", str(f),
                                                                   "--out", str(tmp / "converted")]),
    "weights": ("weights", _real_checkpoint, lambda f, tmp: ["evaluate", "--model", "digits_cnn", "--weights", str(f),
                                                             "--plan", str(tmp / "ok.toml"), "--out",
                                                             str(tmp / "out")]),
}


def _damaged(path, real, damage: str) -> None:
    if damage == "text":
        path.write_text("these are notes, not the file you were looking for\n")
    elif damage == "random bytes":
        path.write_bytes(np.random.default_rng(1).bytes(4096))
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        real(path)
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])


@pytest.mark.parametrize("damage", ["text", "random bytes", "empty", "truncated"])
@pytest.mark.parametrize("kind", list(PATHS))
def test_a_damaged_file_is_one_line_naming_it(kind, damage, tmp_path, capsys):
    name, real, argv = PATHS[kind]
    _real_plan(tmp_path / "ok.toml")
    path = tmp_path / name
    _damaged(path, real, damage)
    code = main(argv(path, tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and name in err, err
