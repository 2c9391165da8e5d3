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
        assert row["robustjax_gflops"] > 0 and row["peer_gflops"] > 0 and row["peak_gflops"] > 0
        assert row["gradient_mflop_per_image"] > row["forward_mflop_per_image"] > 0


def test_model_pass_flops_counts_a_linear_model_in_closed_form():
    """A 64 -> 10 linear classifier: a forward pass is one 64 x 10 product per image (1,280
    FLOPs) plus the bias; the input gradient adds the product's transpose, about twice."""
    import jax.numpy as jnp
    import numpy as np

    import robustjax as rj
    from benchmarks.common import model_pass_flops

    params = {"w": jnp.ones((64, 10)), "b": jnp.zeros(10)}
    clf = rj.Classifier(params=params, apply_fn=lambda p, x: x.reshape(len(x), -1) @ p["w"] + p["b"],
                        num_classes=10, input_shape=(8, 8, 1), name="linear")
    x, y = np.zeros((4, 8, 8, 1), np.float32), np.zeros(4, np.int32)
    forward, gradient = model_pass_flops(clf, x, y)
    assert 2 * 64 * 10 <= forward <= 2 * 64 * 10 + 100
    assert 2 * forward <= gradient <= 2 * forward + 200


def test_each_row_compares_attacks_of_the_same_norm():
    import torchattacks
    from torch import nn

    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    for row in ROWS:
        ours = row.ours(0.1)
        for theirs in row.theirs(model, 0.1):
            l2 = "L2" in type(theirs).__name__ or getattr(theirs, "norm", "Linf") == "L2" or isinstance(theirs, torchattacks.CW)
            assert l2 == (row.norm == "l2") and getattr(ours, "norm", row.norm) == row.norm, row.name
