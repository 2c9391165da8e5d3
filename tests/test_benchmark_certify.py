"""Smoke runs of ``benchmarks.certify`` and ``benchmarks.proxies`` at their ``--quick`` sizes:
each writes its JSON with positive rates, and where the peer ran its results agree."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

# The proxies' smoke run is mostly compiling: without LLVM's optimisations XLA's CPU backend
# compiles it in about half the time. Not for the certify run, whose CROWN passes would then
# run many times slower.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def run_quick(module: str, tmp_path, xla_flags: str = "") -> dict:
    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {xla_flags}".strip())
    subprocess.run([sys.executable, "-m", module, "--quick", "--out", str(tmp_path)], check=True,
                   capture_output=True, env=env, timeout=300)
    (result,) = tmp_path.glob("*.json")
    return json.loads(result.read_text())


def test_certify_benchmark_quick_writes_its_rows(tmp_path):
    pytest.importorskip("art")
    payload = run_quick("benchmarks.certify", tmp_path)
    rows = {row["name"]: row for row in payload["results"]}
    assert {"smoothing_certify_n500", "ibp_eps2_255", "crown_eps2_255"} <= set(rows)
    for row in rows.values():
        assert row["robustjax_images_per_s"] > 0 and row["robustjax_compile_s"] >= 0, row
        if row["peer_available"]:
            assert row["peer_images_per_s"] > 0 and row["ratio"] > 0, row
        else:
            assert row["peer_reason"] and "ratio" not in row, row
    smoothing = rows["smoothing_certify_n500"]
    if smoothing["peer_available"]:  # ART's certify (it needs statsmodels): the same digits, other draws
        assert smoothing["agreement"] >= 0.75 and smoothing["mean_abs_radius_difference"] < 0.1, smoothing
    crown, ibp = rows["crown_eps2_255"], rows["ibp_eps2_255"]
    assert crown["rows_per_pass"] == 256 and 0 <= ibp["verified_accuracy"] <= crown["clean_accuracy"]
    assert crown["verified_accuracy"] == 1.0  # the first test digit is verified at 2/255
    for row in (crown, ibp):
        if row["peer_available"]:  # auto_LiRPA: the same margins' lower bounds
            assert row["max_abs_bound_difference"] < 1e-3, row
        else:
            assert "auto_LiRPA" in row["peer_reason"]


def test_proxies_benchmark_quick_writes_its_rows(tmp_path):
    pytest.importorskip("xautodl")
    payload = run_quick("benchmarks.proxies", tmp_path, FAST_COMPILE)
    rows = {row["name"]: row for row in payload["results"]}
    assert set(rows) == {"jacobian_norm", "hessian_eigenvalue_3_iterations", "ntk_condition_number", "all_three"}
    for name, row in rows.items():
        assert row["networks"] == 2 and row["robustjax_networks_per_hour"] > 0, row
        assert row["peer_networks_per_hour"] > 0 and row["ratio"] > 0, row
        # The same weights, images and start vectors: float32 rounding apart (largest where a
        # value is near 0 and the rounding is large beside it)
        assert row["max_relative_difference"] < 1e-2 and row["median_relative_difference"] < 1e-4, row
