"""Multi-host: two local CPU processes joined by jax.distributed (gloo collectives) evaluate
as one process with all their devices does, and only process 0 writes."""

import json
import os
import socket
import subprocess
import sys

import pytest

PLAN = """
batch_size = 16
num_examples = 40   # an uneven last batch: 16 + 16 + 8
seed = 3
[[attacks]]
name = "fgsm"
eps = 0.1
[[attacks]]
name = "pgd"
eps = [0.05, 0.1]
steps = 3
[corruptions]
names = ["gaussian_noise"]
severities = [3]
[sequences]
names = ["translate"]
batch_size = 8
[sanity]
num_examples = 8
steps = 2
restarts = 2
"""
VARYING = {"timing", "seconds", "created", "environment"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _evaluate(devices: int, out, plan, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "ROBUSTJAX_COMPILE_CACHE": "off"}
    return subprocess.Popen([sys.executable, "-m", "robustjax.cli", "evaluate", "--plan", str(plan), "--out", str(out),
                             "--quiet", *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _assert_close(a, b, path="report"):
    """Equal, but floats (figures averaged in another order) within 1e-5."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a.keys() - VARYING:
            _assert_close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-5), path
    else:
        assert a == b, path


def test_two_processes_as_two_hosts_give_the_report_of_one_process(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    port = _free_port()
    hosts = [_evaluate(2, tmp_path / f"host{i}", plan, "--distributed", "--coordinator", f"127.0.0.1:{port}",
                       "--num-processes", "2", "--process-id", str(i)) for i in (1, 0)]
    single = _evaluate(4, tmp_path / "single", plan)
    for process in [*hosts, single]:
        output, _ = process.communicate(timeout=3600)  # a hang guard only
        assert process.returncode == 0, output
    assert not (tmp_path / "host1").exists()  # process 1 computes and writes nothing
    multi = json.loads((tmp_path / "host0" / "report.json").read_text())
    one = json.loads((tmp_path / "single" / "report.json").read_text())
    assert multi["status"] == "complete" and multi["dataset"]["num_examples"] == 40
    assert multi["attacks"][1]["robust_accuracy"] < multi["clean"]["accuracy"]  # the attacks did something
    _assert_close(multi, one)
    assert (tmp_path / "host0" / "report.html").is_file()


def test_cluster_options_need_distributed(tmp_path):
    result = subprocess.run([sys.executable, "-m", "robustjax.cli", "evaluate", "--out", str(tmp_path / "r"),
                             "--process-id", "1"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "--coordinator, --num-processes and --process-id go with --distributed" in result.stderr
    result = subprocess.run([sys.executable, "-m", "robustjax.cli", "evaluate", "--out", str(tmp_path / "r"),
                             "--distributed", "--coordinator", "127.0.0.1:1"], capture_output=True, text=True)
    assert result.returncode == 2 and "together, or none of them" in result.stderr
