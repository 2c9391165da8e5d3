"""A sweep whose plan has the 23 metrics, cold: wall time and XLA compiles of
`robustjax sweep run` over two NB201 digits cells, with no compile cache, per checkout.

    python -m benchmarks.metrics_sweep                        # this checkout
    python -m benchmarks.metrics_sweep --source /tmp/before   # and another (git worktree)

The plan: FGSM and PGD-2 (two epsilons), one corruption, the 23 metrics reading the PGD
entry (digits_mlp as reference), on 32 test digits. Such a plan evaluates each network alone
(its ``report`` item); since issue 33 that one evaluation also gives the clean, attack and
corruption rows, which a population ran a second time before. Writes
results/metrics_sweep.cpu.json.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.default_evaluation import cold_command, compare_checkouts

PLAN = """batch_size = 16
num_examples = 32
seed = 0
[[attacks]]
name = "fgsm"
eps = 0.1
[[attacks]]
name = "pgd"
norm = "linf"
eps = [0.1, 0.2]
steps = 2
[corruptions]
names = ["brightness"]
severities = [3]
[metrics]
reference = "digits_mlp"
ebd_directions = 8
ebd2_step = 0.05
ebd2_max_steps = 10
[metrics.attack]
name = "pgd"
norm = "linf"
eps = 0.1
steps = 2
"""


def run(source: Path) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        plan = Path(folder, "plan.toml")
        plan.write_text(PLAN)
        return cold_command(source, ["sweep", "run", "--db", str(Path(folder, "s.sqlite")), "--space", "nb201_digits",
                                     "--ids", "11472,0", "--plan", str(plan), "--population-size", "2",
                                     "--calibration-images", "256", "--compile-cache", "off", "--quiet"])


def main() -> None:
    compare_checkouts("metrics_sweep", run, __doc__.splitlines()[0], plan=PLAN)


if __name__ == "__main__":
    main()
