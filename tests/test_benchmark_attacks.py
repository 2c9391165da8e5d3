import json
import subprocess
import sys

import pytest

pytest.importorskip("torchattacks")
pytestmark = pytest.mark.torch

from benchmarks.attacks import ROWS  # noqa: E402


def test_attack_benchmark_runs_every_row_and_writes_its_json(tmp_path):
    subprocess.run([sys.executable, "-m", "benchmarks.attacks", "--model", "digits", "--batch-size", "8",
                    "--repeats", "1", "--out", str(tmp_path)], check=True, capture_output=True)
    (result,) = tmp_path.glob("attacks_digits.*.json")
    payload = json.loads(result.read_text())
    assert payload["settings"]["batch_size"] == 8
    assert [row["name"] for row in payload["results"]] == [row.name for row in ROWS]
    (grid,) = [row for row in payload["results"] if row["name"] == "pgd20_linf_grid8"]
    assert len(grid["params"]["eps_grid"]) == 8
    for row in payload["results"]:
        assert row["robustjax_images_per_s"] > 0 and row["peer_images_per_s"] > 0
        assert 0 <= row["robustjax_success_rate"] <= 1 and 0 <= row["peer_success_rate"] <= 1


def test_each_row_compares_attacks_of_the_same_norm():
    import torchattacks
    from torch import nn

    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    for row in ROWS:
        ours = row.ours(0.1)
        for theirs in row.theirs(model, 0.1):
            l2 = "L2" in type(theirs).__name__ or getattr(theirs, "norm", "Linf") == "L2" or isinstance(theirs, torchattacks.CW)
            assert l2 == (row.norm == "l2") and getattr(ours, "norm", row.norm) == row.norm, row.name
