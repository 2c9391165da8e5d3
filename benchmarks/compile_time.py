"""Compile time as a user meets it: the first call of AutoAttack in a fresh process, with an
empty persistent compile cache and with the cache a first process filled, beside the same
call once compiled; and the quick start's evaluation, cold and warm (`default_evaluation`).

    python -m benchmarks.compile_time [--batch-size N] [--skip-evaluate]

Each AutoAttack row runs in its own Python process (``JAX_LOG_COMPILES=1`` counts the
programs XLA builds): ``standard`` at Linf 0.1 on the trained digits CNN, ``--batch-size``
test images, called on arrays (the still-robust examples gathered into batches of a few
sizes). Writes results/compile_time.BACKEND.json.
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

from benchmarks.common import RESULTS, machine_facts
from benchmarks.default_evaluation import HERE
from benchmarks.default_evaluation import run as default_evaluation


def first_and_second_call(batch_size: int, cache: str) -> dict:
    """In this process: seconds of the first and second AutoAttack call, ``cache`` as JAX's
    persistent compile cache."""
    import jax

    import robustjax as rj
    from robustjax.compile_cache import use_compile_cache

    use_compile_cache(cache)
    clf = rj.zoo.create("digits_cnn")
    x, y = rj.data.digits("test").arrays(limit=batch_size)
    attack = rj.attacks.AutoAttack(eps=0.1)
    seconds = []
    for _ in range(2):
        started = time.perf_counter()
        result = attack(clf, x, y, key=jax.random.key(0))
        jax.block_until_ready(result.x_adv)
        seconds.append(time.perf_counter() - started)
    return {"first_call_s": round(seconds[0], 1), "second_call_s": round(seconds[1], 2),
            "robust_accuracy": round(1 - float(result.success.mean()), 4)}


def autoattack_in_fresh_process(batch_size: int, cache: str) -> dict:
    """:func:`first_and_second_call` in a fresh Python process, with its compile count."""
    env = os.environ | {"JAX_LOG_COMPILES": "1", "PYTHONPATH": str(HERE)}
    env.pop("XLA_FLAGS", None)  # the default devices, as a user runs it
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.compile_time", "--child", cache,
                           "--batch-size", str(batch_size)], cwd=HERE, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the AutoAttack process failed: {done.stderr[-2000:]}")
    return {**json.loads(done.stdout.splitlines()[-1]), "process_wall_s": round(time.perf_counter() - started, 1),
            "compiles": sum("Compiling " in line for line in done.stderr.splitlines())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--skip-evaluate", action="store_true", help="only the AutoAttack rows")
    parser.add_argument("--child", metavar="CACHE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(first_and_second_call(args.batch_size, args.child)))
        return
    with tempfile.TemporaryDirectory() as cache:
        rows = {"autoattack_empty_cache": autoattack_in_fresh_process(args.batch_size, cache),
                "autoattack_filled_cache": autoattack_in_fresh_process(args.batch_size, cache)}
    if not args.skip_evaluate:
        rows["default_evaluation"] = default_evaluation(HERE)
    for name, row in rows.items():
        print(f"{name}: {row}")
    path = RESULTS / f"compile_time.{machine_facts(())['backend']}.json"
    path.write_text(json.dumps({
        "benchmark": "compile_time", "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(()), "batch_size": args.batch_size, "autoattack": "standard, Linf 0.1, digits CNN",
        "results": rows}, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
