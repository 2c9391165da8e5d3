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
