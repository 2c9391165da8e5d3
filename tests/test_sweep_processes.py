"""Sweeps as processes: `robustjax sweep run` killed with SIGKILL at random moments and rerun
ends with every row exactly once and the values of an uninterrupted run; on a Ray cluster
started here (loopback), the rows are the local executor's, they arrive as each item ends,
a worker killed in the middle of a task has its task retried without duplicates, and a
second sweep's workers compile nothing (their shared compile cache holds every program)."""

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

PLAN = """batch_size = 16
num_examples = 32
[[attacks]]
name = "fgsm"
eps = 0.1
[[attacks]]
name = "pgd"
eps = 0.1
steps = 3
"""
IDS = "11472,0,9,1200,15624,100"
ITEMS = 3  # clean, fgsm, pgd
ROWS = 6 * ITEMS
HANG_S = 3600  # guards against a hung process only; a run takes well under a minute
COLUMNS = "arch_id, item_key, data_key, status, figures, outcome, examples, error"


def _env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "ROBUSTJAX_COMPILE_CACHE")}
    return env | {"RAY_USAGE_STATS_ENABLED": "0", "ROBUSTJAX_COMPILE_CACHE": str(tmp / "xla")}


def _command(db: Path, plan: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "robustjax.cli", "sweep", "run", "--db", str(db), "--space", "nb201_digits",
            "--ids", IDS, "--plan", str(plan), "--population-size", "2", "--calibration-images", "128", "--quiet",
            *extra]


def _rows(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as connection:
        return connection.execute(f"SELECT {COLUMNS} FROM results ORDER BY arch_id, item_key").fetchall()


def _count(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=30) as connection:
            return connection.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    except sqlite3.OperationalError:  # not made yet
        return 0


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweeps")
    (tmp / "plan.toml").write_text(PLAN)
    return tmp


@pytest.fixture(scope="module")
def reference(workdir):
    db = workdir / "reference.sqlite"
    subprocess.run(_command(db, workdir / "plan.toml"), check=True, env=_env(workdir), timeout=HANG_S)
    rows = _rows(db)
    assert len(rows) == ROWS and all(row[3] == "ok" for row in rows)
    return rows


def test_killed_at_random_moments_and_rerun_loses_and_duplicates_nothing(workdir, reference):
    db = workdir / "killed.sqlite"
    rng = np.random.default_rng(7)
    kills = 0
    # Each kill comes after a random number of rows, leaving at least two items of the last
    # population to run; the random delay may still let a run finish (its compiles are cached
    # by then), which is not counted as a kill: the rounds after a kill are the resumes tested.
    for target in sorted(rng.choice(np.arange(1, ROWS - 4), size=3, replace=False)):
        process = subprocess.Popen(_command(db, workdir / "plan.toml"), env=_env(workdir))
        while _count(db) < target and process.poll() is None:
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 1.0))  # somewhere inside the next item
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait()
        partial = _rows(db)
        assert set(partial) <= set(reference) and len(set(partial)) == len(partial)
    assert kills >= 2
    subprocess.run(_command(db, workdir / "plan.toml"), check=True, env=_env(workdir), timeout=HANG_S)
    assert _rows(db) == reference
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT COUNT(*) FROM claims").fetchone()[0] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _task_pids() -> list[int]:
    listing = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in listing.splitlines() if "ray::_evaluate_task" in line]


def test_ray_cluster_gives_the_local_rows_and_retries_a_killed_worker(workdir, reference):
    ray = str(Path(sys.executable).parent / "ray")
    port = _free_port()
    env = _env(workdir)
    subprocess.run([ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                    "--include-dashboard=false", "--disable-usage-stats"], check=True, env=env, timeout=HANG_S,
                   capture_output=True)
    try:
        db, cache = workdir / "ray.sqlite", workdir / "ray-xla"
        ray_run = ("--ray", f"127.0.0.1:{port}", "--compile-cache", str(cache))
        process = subprocess.Popen(_command(db, workdir / "plan.toml", *ray_run), env=env)
        while not _task_pids() and process.poll() is None:
            time.sleep(0.1)
        time.sleep(1.0)  # inside the task: loading, recalibrating or evaluating
        victims = _task_pids()
        assert victims, "no Ray task ran"
        os.kill(victims[0], signal.SIGKILL)
        counts = set()
        while process.poll() is None:
            counts.add(_count(db))
            time.sleep(0.05)
        assert process.wait(timeout=HANG_S) == 0
        assert _rows(db) == reference
        # rows arrive item by item (2 networks each), not only when a task's 3 items end
        assert any(count % (2 * ITEMS) for count in counts), counts
        # the workers keep their programs in the shared cache (only they run the attacks), and
        # a second sweep's workers find every program there: they compile nothing new
        compiled = set(os.listdir(cache))
        assert any(name.startswith("jit__attack_records") for name in compiled), sorted(compiled)
        subprocess.run(_command(workdir / "again.sqlite", workdir / "plan.toml", *ray_run), check=True, env=env,
                       timeout=HANG_S)
        assert _rows(workdir / "again.sqlite") == reference
        assert set(os.listdir(cache)) == compiled
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, timeout=HANG_S, capture_output=True)
