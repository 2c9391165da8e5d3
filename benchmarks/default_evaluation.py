"""The quick start's evaluation: wall time and XLA compiles of `robustjax evaluate` on the
embedded default in a fresh process per checkout, cold (empty compile cache), warm (cache
filled, ``--fresh``) and rerun (every item resumed), and of `robustjax plan check`.

    python -m benchmarks.default_evaluation                        # this checkout
    python -m benchmarks.default_evaluation --source /tmp/before   # and another (git worktree)

Compiles are counted from JAX's own log (``JAX_LOG_COMPILES=1``: one "Compiling" line per
program XLA builds). Writes results/default_evaluation.cpu.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, machine_facts

HERE = Path(__file__).resolve().parent.parent


def run(source: Path) -> dict:
    """Wall seconds and compiles of the default evaluation of ``source``'s robustjax: cold (an
    empty compile cache), warm (``--fresh``: every item again, the programs from the cache),
    rerun (the same command once more: every item read back), and of ``plan check``."""
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as cache:
        evaluate = ["evaluate", "--out", out, "--compile-cache", cache, "--quiet"]
        cold = cold_command(source, evaluate)
        warm = cold_command(source, [*evaluate, "--fresh"])
        rerun = cold_command(source, evaluate)
        plan = Path(out, "plan.toml")
        plan.write_text(subprocess.run([sys.executable, "-m", "robustjax.cli", "plan", "show", "default"], cwd=source,
                                       env=os.environ | {"PYTHONPATH": str(source)}, capture_output=True, text=True,
                                       check=True).stdout)
        check = cold_command(source, ["plan", "check", str(plan)])
    return {"source": str(source), "wall_s": cold["wall_s"], "compiles": cold["compiles"],
            "warm_cache_wall_s": warm["wall_s"], "warm_cache_compiles": warm["compiles"],
            "rerun_wall_s": rerun["wall_s"], "rerun_compiles": rerun["compiles"], "plan_check_wall_s": check["wall_s"]}


def cold_command(source: Path, argv: list[str]) -> dict:
    """Wall seconds and XLA compiles of ``robustjax ARGV`` run with ``source``'s robustjax in a
    fresh process (``JAX_LOG_COMPILES=1``: one "Compiling" line per program XLA builds)."""
    env = os.environ | {"PYTHONPATH": str(source), "JAX_LOG_COMPILES": "1"}
    env.pop("XLA_FLAGS", None)  # the default devices, as a user runs it
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "robustjax.cli", *argv], cwd=source, env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"robustjax {argv[0]} of {source} failed: {done.stderr[-2000:]}")
    return {"source": str(source), "wall_s": round(wall, 1),
            "compiles": sum("Compiling " in line for line in done.stderr.splitlines())}


def compare_checkouts(benchmark: str, run_one, description: str, **settings) -> None:
    """Runs ``run_one(source)`` for each ``--source`` checkout and this one, prints and writes
    the rows to results/BENCHMARK.BACKEND.json with ``settings``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--source", action="append", default=[], help="another checkout to time as well")
    args = parser.parse_args()
    rows = [run_one(Path(source).resolve()) for source in args.source] + [run_one(HERE)]
    for row in rows:
        print(f"{row['source']}: {row['wall_s']} s, {row['compiles']} compiles"
              + "".join(f"; {key} {value}" for key, value in row.items() if key not in ("source", "wall_s", "compiles")))
    path = RESULTS / f"{benchmark}.{machine_facts(())['backend']}.json"
    path.write_text(json.dumps({
        "benchmark": benchmark, "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(()), **settings, "results": rows}, indent=2) + "\n")
    print(f"written to {path}")


def main() -> None:
    compare_checkouts("default_evaluation", run, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
