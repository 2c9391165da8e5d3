"""Peak memory of `robustjax sweep export` on a synthetic store as large as a sweep of every
NAS-Bench-201 cell: 15,625 networks x 100 figures (10 attack items of 10 epsilons each) x
1,000 examples, outcomes drawn at random. Each checkout exports in a fresh process; peak
resident memory comes from the kernel (``ru_maxrss`` of the child), beside the same export
of a store of 16 networks (what importing robustjax alone takes).

    python -m benchmarks.export_memory                        # this checkout
    python -m benchmarks.export_memory --source /tmp/before   # and another (git worktree)

Writes results/export_memory.cpu.json.
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

import numpy as np

from benchmarks.common import RESULTS, machine_facts

HERE = Path(__file__).resolve().parent.parent
ITEMS, EPSILONS = 10, 10


def synthetic_store(path: Path, networks: int, examples: int) -> None:
    """A sweep store of ``networks`` NB201 cells, every (network, item) row finished."""
    from robustjax import nas
    from robustjax.nas.models import network_card
    from robustjax.sweep.store import Store

    space = nas.space("nb201")
    eps = [round(0.01 * (e + 1), 2) for e in range(EPSILONS)]
    store = Store.open(path, {"data_key": "synthetic", "networks": networks, "examples": examples})
    items = [(f"item{i}", "attack", {"attack": f"a{i}", "params": {"norm": "linf"}, "eps": eps, "restarts": 1},
              tuple(f"a{i} eps={e:g}" for e in eps)) for i in range(ITEMS)]
    store.set_items(items)
    configs = [space.config(index) for index in range(networks)]
    store.add_networks([(c.arch_id, "32", network_card(space, c)) for c in configs])
    rng = np.random.default_rng(0)
    row_bytes = EPSILONS * -(-examples // 8)
    for start in range(0, networks, 1024):
        rows = [{"arch_id": c.arch_id, "item_key": key, "status": "ok", "figures": dict.fromkeys(labels, 0.5),
                 "outcome": rng.bytes(row_bytes), "examples": examples, "seconds": 1.0, "worker": "synthetic"}
                for c in configs[start:start + 1024] for key, _, _, labels in items]
        store.commit(rows)
    store.close()


def export_peak(source: Path, db: Path) -> dict:
    """Wall seconds and peak resident MiB of exporting ``db`` as Parquet with ``source``'s robustjax."""
    with tempfile.TemporaryDirectory() as out:
        env = os.environ | {"PYTHONPATH": str(source)}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c",
                               "import resource, sys; from robustjax.cli import main; "
                               f"code = main(['sweep', 'export', '--db', {str(db)!r}, '--format', 'parquet', "
                               f"'--out', {str(Path(out, 'r.parquet'))!r}]); "
                               "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(code)"],
                              cwd=source, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"export with {source} failed: {done.stderr[-2000:]}")
    return {"wall_s": round(wall, 1), "peak_mib": round(int(done.stdout.split()[-1]) / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, action="append", default=[], help="another checkout to compare")
    parser.add_argument("--networks", type=int, default=15625)
    parser.add_argument("--examples", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        big, small = Path(folder, "big.sqlite"), Path(folder, "small.sqlite")
        synthetic_store(big, args.networks, args.examples)
        synthetic_store(small, 16, args.examples)
        results = [{"source": str(source), "store": export_peak(source, big), "sixteen_networks": export_peak(source, small)}
                   for source in [HERE, *args.source]]
        store_mib = round(big.stat().st_size / 2**20)
    record = {"benchmark": "export_memory", "date": datetime.date.today().isoformat(), "machine": machine_facts(()),
              "networks": args.networks, "figures": ITEMS * EPSILONS, "examples": args.examples,
              "store_mib": store_mib, "results": results}
    (RESULTS / "export_memory.cpu.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
