"""The quick start's evaluation, cold: wall time and XLA compiles of `robustjax evaluate` on the
embedded default, with no compile cache, in a fresh process per checkout.

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
    """Wall seconds, compiles and report status of the default evaluation of ``source``'s robustjax."""
    with tempfile.TemporaryDirectory() as out:
        env = os.environ | {"PYTHONPATH": str(source), "JAX_LOG_COMPILES": "1"}
        env.pop("XLA_FLAGS", None)  # the default devices, as a user runs it
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "robustjax.cli", "evaluate", "--out", out, "--compile-cache",
                               "off", "--quiet"], cwd=source, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"robustjax evaluate of {source} failed: {done.stderr[-2000:]}")
    return {"source": str(source), "wall_s": round(wall, 1),
            "compiles": sum("Compiling " in line for line in done.stderr.splitlines())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", action="append", default=[], help="another checkout to time as well")
    args = parser.parse_args()
    rows = [run(Path(source).resolve()) for source in args.source] + [run(HERE)]
    for row in rows:
        print(f"{row['source']}: {row['wall_s']} s, {row['compiles']} compiles")
    path = RESULTS / f"default_evaluation.{machine_facts(())['backend']}.json"
    path.write_text(json.dumps({
        "benchmark": "default_evaluation",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_facts(()), "results": rows}, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
