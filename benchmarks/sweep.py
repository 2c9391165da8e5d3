"""Sweep engine: networks per hour of `robustjax sweep run`, local against Ray, and what the
store, claims and progress cost.

A fixed small sweep (subnets of the bundled NAS-Bench-201 digits supernet; clean, FGSM and
PGD-10 at Linf eps 0.1 on 256 test images; batch norm recalibrated on 1,024 training
images) runs as the command runs it, in a fresh process each time, with no compile cache:

- ``local``: the local executor, fresh database;
- ``ray``: the Ray executor on a cluster of 2 CPU workers started here (loopback);
- ``resume``: the local command killed (SIGKILL) once half the rows are in, then rerun: the
  two runs' wall time against an uninterrupted one;
- ``noop``: the command rerun on a finished database (what a resume costs with nothing to do).

Bookkeeping: the local sweep again in this process, with every call into the store
(claims, lookups, commits, renewals) timed; reported as a share of the wall time.

    python -m benchmarks.sweep --networks 128
    python -m benchmarks.sweep --networks 1200 --modes local   # the 1,200-network target
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, machine_facts

PLAN = """batch_size = 256
num_examples = 256
seed = 0
[[attacks]]
name = "fgsm"
eps = 0.1
[[attacks]]
name = "pgd"
norm = "linf"
eps = 0.1
steps = 10
"""
MODES = ("local", "ray", "resume", "noop", "bookkeeping")


def command(db: Path, plan: Path, networks: int, population_size: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "robustjax.cli", "sweep", "run", "--db", str(db), "--n", str(networks),
            "--plan", str(plan), "--population-size", str(population_size), "--calibration-images", "1024",
            "--compile-cache", "off", "--quiet", *extra]


def rows(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=30) as connection:
            return connection.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def timed_run(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env)
    return time.perf_counter() - start


def killed_then_resumed(cmd: list[str], env: dict, db: Path, at_rows: int) -> float:
    start = time.perf_counter()
    process = subprocess.Popen(cmd, env=env)
    while rows(db) < at_rows and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    subprocess.run(cmd, check=True, env=env)
    return time.perf_counter() - start


def on_ray(cmd: list[str], env: dict, workers: int) -> float:
    ray = str(Path(sys.executable).parent / "ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run([ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={workers}",
                    "--include-dashboard=false", "--disable-usage-stats"], check=True, env=env, capture_output=True)
    try:
        return timed_run([*cmd, "--ray", f"127.0.0.1:{port}"], env)
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True)


def bookkeeping(db: Path, plan: Path, networks: int, population_size: int) -> dict:
    """The local sweep in this process, with the time spent inside the store's methods."""
    import jax

    from robustjax import nas
    from robustjax.evaluation import load_plan
    from robustjax.sweep import Store, Sweep, open_store, run_local
    from robustjax.sweep.store import worker_id

    spent = [0.0]

    def timing(method):
        @functools.wraps(method)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start
        return wrapper

    for name in ("claim", "renew", "release", "missing", "commit", "networks", "done"):
        setattr(Store, name, timing(getattr(Store, name)))
    sweep = Sweep(load_plan(plan), space="nb201_digits", population_size=population_size, calibration_images=1024)
    start = time.perf_counter()
    store, selection = open_store(sweep, str(db), nas.space("nb201_digits").sample(jax.random.key(0), networks))
    run_local(sweep, store, selection, worker=worker_id(), on_chunk=lambda chunk: store.done())  # as the progress
    wall = time.perf_counter() - start
    return {"seconds": round(wall, 1), "store_seconds": round(spent[0], 3),
            "store_share": round(spent[0] / wall, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", type=int, default=128)
    parser.add_argument("--population-size", type=int, default=64)
    parser.add_argument("--ray-workers", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {MODES}")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    modes = args.modes.split(",")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"RAY_USAGE_STATS_ENABLED": "0"}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        plan = tmp / "plan.toml"
        plan.write_text(PLAN)

        def cmd(name: str) -> list[str]:
            return command(tmp / f"{name}.sqlite", plan, args.networks, args.population_size)

        def per_hour(seconds: float) -> dict:
            return {"seconds": round(seconds, 1), "networks_per_hour": round(args.networks / seconds * 3600)}

        if "local" in modes or "noop" in modes:
            results["local"] = per_hour(timed_run(cmd("local"), env))
        if "noop" in modes:
            results["noop"] = {"seconds": round(timed_run(cmd("local"), env), 1)}
        if "ray" in modes:
            results["ray"] = per_hour(on_ray(cmd("ray"), env, args.ray_workers)) | {"workers": args.ray_workers}
        if "resume" in modes:
            total = args.networks * 3
            results["resume"] = per_hour(killed_then_resumed(cmd("resume"), env, tmp / "resume.sqlite", total // 2))
        if "bookkeeping" in modes:
            results["bookkeeping"] = bookkeeping(tmp / "bookkeeping.sqlite", plan, args.networks,
                                                 args.population_size)
    for name, row in results.items():
        print(f"{name:12s} " + "  ".join(f"{k} {v}" for k, v in row.items()))
    if "local" in results and "ray" in results:
        results["ray_over_local"] = round(results["ray"]["networks_per_hour"] / results["local"]["networks_per_hour"], 2)
    if "local" in results and "resume" in results:
        results["resume_over_uninterrupted"] = round(results["resume"]["seconds"] / results["local"]["seconds"], 2)
    print({k: v for k, v in results.items() if k.endswith("_over_local") or k.endswith("uninterrupted")})
    facts = machine_facts(("ray",))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sweep_{args.networks}.{facts['backend']}.json"
    path.write_text(json.dumps({
        "benchmark": "sweep", "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": facts, "settings": {"space": "nb201_digits", "networks": args.networks, "plan": PLAN,
                                       "population_size": args.population_size, "calibration_images": 1024},
        "results": results}, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
