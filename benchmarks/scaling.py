"""Scaling curve: PGD-20 throughput on 1, 2, 4 and 8 simulated CPU devices.

    python -m benchmarks.scaling [--devices 1,2,4,8] [--batch-size 256] [--repeats 5] [--out DIR]

Each device count runs in its own process (``XLA_FLAGS=--xla_force_host_platform_device_count=N``
must be set before JAX starts its backend): the digits CNN (trained weights) attacks 256
digits with Linf PGD-20 (eps 0.1, every step: no early stop, so the work is the same at every
N), one jitted program whose batch is sharded over the N devices as
``robustjax.evaluation.parallel.DataParallel`` shards evaluation batches (the classifier
replicated). Images/s is the median of ``--repeats`` calls after the first; the speedup and
parallel efficiency are against one device. The simulated devices share the machine's cores,
so this measures what sharding costs or gains on one CPU, not what more chips would give.
The load average (``/proc/loadavg``) before and after each run is recorded, since other
processes move these figures. Results: results/scaling.cpu.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS

FLAG = "--xla_force_host_platform_device_count"


def load_average() -> list[float] | None:
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def child(batch_size: int, repeats: int, steps: int) -> dict:
    """One device count (this process's): images/s of the sharded PGD program."""
    import jax
    import numpy as np

    import robustjax as rj
    from benchmarks.common import timed
    from robustjax.evaluation.parallel import DataParallel

    parallel = DataParallel(batch_size)
    clf = parallel.replicate(rj.zoo.create("digits_cnn"))
    x, y = rj.data.digits("all").arrays(limit=batch_size)
    x, y = jax.device_put(x, parallel.sharded), jax.device_put(y, parallel.sharded)
    attack = rj.attacks.PGD(eps=0.1, norm="linf", steps=steps, early_stop=False)
    program = jax.jit(lambda c, images, labels, key: attack(c, images, labels, key=key))
    key = jax.random.key(0)
    first, seconds, result = timed(lambda: jax.block_until_ready(program(clf, x, y, key)), repeats)
    return {"devices": jax.device_count(), "batch": batch_size, "steps": steps,
            "images_per_s": batch_size / seconds, "seconds": seconds, "compile_s": max(first - seconds, 0.0),
            "success_rate": float(np.mean(result.success)),
            "x_adv_sum": float(np.asarray(result.x_adv, np.float64).sum()),
            "shards": len(result.x_adv.sharding.device_set)}


def run(devices: int, args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(FLAG)]
    env["XLA_FLAGS"] = " ".join([*flags, f"{FLAG}={devices}"])
    before = load_average()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--child", "--batch-size", str(args.batch_size),
                           "--repeats", str(args.repeats), "--steps", str(args.steps)],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{devices} devices: the child failed:\n{done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    return row | {"wall_s": time.perf_counter() - start, "load_before": before, "load_after": load_average(),
                  "xla_flags": env["XLA_FLAGS"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="1,2,4,8", help="comma-separated simulated device counts")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls after the first (median taken)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.batch_size, args.repeats, args.steps)))
        return
    rows = [run(int(n), args) for n in args.devices.split(",")]
    base = rows[0]["images_per_s"] / rows[0]["devices"]
    print(f"PGD-{args.steps} Linf, digits CNN, batch {args.batch_size}, {os.cpu_count()} CPU cores")
    print(f"{'devices':>7s} {'img/s':>9s} {'speedup':>8s} {'efficiency':>10s} {'compile s':>10s} "
          f"{'success':>8s} {'load before/after':>18s}")
    for row in rows:
        row["speedup"] = row["images_per_s"] / rows[0]["images_per_s"]
        row["efficiency"] = row["images_per_s"] / (base * row["devices"])
        load = f"{row['load_before'][0]:.2f}/{row['load_after'][0]:.2f}" if row["load_before"] else "-"
        print(f"{row['devices']:7d} {row['images_per_s']:9.1f} {row['speedup']:8.2f} {row['efficiency']:10.2f} "
              f"{row['compile_s']:10.2f} {row['success_rate']:8.3f} {load:>18s}")
    same = len({round(row["x_adv_sum"], 2) for row in rows}) == 1 and len({row["success_rate"] for row in rows}) == 1
    print(f"same adversarial examples at every device count: {same}")
    from benchmarks.common import machine_facts  # after the children: this process sees one device

    facts = machine_facts(())
    facts.pop("device_count"), facts.pop("xla_flags")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "scaling.cpu.json"
    path.write_text(json.dumps({
        "benchmark": "scaling", "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": facts, "settings": {"model": "digits_cnn", "attack": f"PGD-{args.steps} linf eps 0.1, no early stop",
                                       "batch_size": args.batch_size, "repeats": args.repeats,
                                       "sharding": "DataParallel: batch split over the devices, classifier replicated"},
        "results": rows, "results_equal": same}, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
