import json
import subprocess
import sys

import pytest

pytest.importorskip("torchattacks")
pytestmark = pytest.mark.torch


def test_digits_attack_benchmark_runs_and_writes_its_json(tmp_path):
    subprocess.run([sys.executable, "-m", "benchmarks.digits_attacks", "--batch-size", "16", "--repeats", "1",
                    "--out", str(tmp_path)], check=True, capture_output=True)
    (result,) = tmp_path.glob("digits_attacks.*.json")
    payload = json.loads(result.read_text())
    assert {row["name"] for row in payload["results"]} == {"fgsm", "pgd10_linf"}
    assert payload["machine"]["versions"]["torchattacks"]
    for row in payload["results"]:
        assert row["robustjax_images_per_s"] > 0 and row["peer_images_per_s"] > 0


def test_accelerator_benchmark_smoke_writes_every_row(tmp_path):
    """``benchmarks.accelerator --smoke``: every row at tiny sizes on the CPU, with positive
    throughput and model FLOP utilisation, and torchattacks beside each attack."""
    subprocess.run([sys.executable, "-m", "benchmarks.accelerator", "--smoke", "--repeats", "0",
                    "--out", str(tmp_path)], check=True, capture_output=True)
    (result,) = tmp_path.glob("accelerator.*.json")
    payload = json.loads(result.read_text())
    rows = {row["name"]: row for row in payload["results"]}
    assert set(rows) == {"resnet50_pgd10_float32", "resnet50_pgd20_float32", "resnet50_pgd10_bfloat16",
                         "resnet50_pgd20_bfloat16", "wrn28_10_cw_l2", "wrn28_10_apgd_ce", "wrn28_10_square",
                         "wrn28_10_autoattack", "imagenet_c_15", "nb201_population_pgd10",
                         "nb201_sweep_vs_torch", "nb201_training_population"}
    assert payload["machine"]["peaks"]["tflops"]["float32"] > 0
    for row in rows.values():
        assert "error" not in row and "skipped" not in row, row
        assert row["robustjax_images_per_s"] > 0 and row["mfu"] > 0 and row["robustjax_compile_s"] >= 0, row
        if row["kind"] == "attack":
            assert row["peer"].startswith("torchattacks") and row["peer_images_per_s"] > 0 and row["ratio"] > 0, row
    assert rows["nb201_population_pgd10"]["robustjax_networks_per_s"] > 0
    trained = rows["nb201_training_population"]
    assert trained["peer_images_per_s"] > 0 and trained["executed_over_own"] > 1, trained
    sweep = rows["nb201_sweep_vs_torch"]
    assert sweep["peer_images_per_s"] > 0 and sweep["ratio"] > 0 and sweep["nas"]["results_equal"] is True, sweep
