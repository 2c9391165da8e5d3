"""Mutation testing of one package with its own tests, within a budget (not part of CI).

    python -m benchmarks.mutation metrics --sample 40 --budget-minutes 30
    python -m benchmarks.mutation attacks --module robustjax/attacks/square.py --sample 20

Cosmic Ray (``pip install -e ".[mutation]"``) mutates the package's source one operator
at a time and runs the package's test files (``TESTS``) against each mutant; a mutant the
tests fail on is killed, one they pass on survived. It mutates files in place, so the run
happens in a git worktree of ``HEAD`` in a temporary folder, never in this checkout, with
that worktree first on ``PYTHONPATH``. A package has thousands of mutants and its tests
take seconds to minutes, so ``--sample`` mutants are drawn at random (seeded) and the
others marked skipped; what the budget does not reach stays pending. The score is killed
/ (killed + survived) over the mutants that ran (a test run past ``--timeout-s`` is
counted apart, as timed out, and not scored); the survivors, with their diffs, go to
results/mutation_PACKAGE.json for triage: each one is a missing test or an equivalent
mutant.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import RESULTS

HERE = Path(__file__).resolve().parent.parent
# The test files that exercise each package, as globs (run with -x: the first failure kills a mutant).
TESTS = {
    "attacks": ["tests/test_attack*.py", "tests/test_notice_attacks.py", "tests/test_torchattacks_parity.py"],
    "nas": ["tests/test_nas_*.py", "tests/test_notice_nas.py", "tests/test_space_contract.py"],
    "sweep": ["tests/test_sweep*.py", "tests/test_notice_sweep.py"],
    "metrics": ["tests/test_metrics_*.py", "tests/test_metric_defects.py"],
    "evaluation": ["tests/test_evaluation*.py", "tests/test_records.py", "tests/test_resume.py",
                   "tests/test_metric_suite.py", "tests/test_sanity.py", "tests/test_notice_sanity.py",
                   "tests/test_plan.py", "tests/test_natural_shift.py"],
}


def config(module: str, tests: list[str], timeout_s: float) -> str:
    """Cosmic Ray's session configuration: mutate ``module`` (a file or a package folder),
    kill with ``tests``."""
    command = f"{sys.executable} -m pytest -x -q -n 0 -p no:cacheprovider {' '.join(tests)}"
    return (f'[cosmic-ray]\nmodule-path = "{module}"\ntimeout = {timeout_s}\nexcluded-modules = []\n'
            f'test-command = "{command}"\n\n[cosmic-ray.distributor]\nname = "local"\n')


def sample(session: Path, keep: int, seed: int) -> int:
    """Marks all but ``keep`` randomly drawn pending mutants of ``session`` skipped; returns
    how many mutants the session has."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as db:
        items = [item.job_id for item in db.pending_work_items]
        random.Random(seed).shuffle(items)
        db.set_multiple_results(items[keep:], WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
        return len(items)


def outcomes(session: Path) -> dict:
    """The counts of the mutants that ran, the score, and each survivor's diff."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    counts = {"killed": 0, "survived": 0, "timed_out": 0, "incompetent": 0, "pending": 0}
    survivors = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        counts["pending"] = sum(1 for _ in db.pending_work_items)
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            if result.test_outcome == TestOutcome.SURVIVED:
                counts["survived"] += 1
                survivors.append({"module": str(item.mutations[0].module_path), "line": item.mutations[0].start_pos[0],
                                  "operator": item.mutations[0].operator_name, "diff": result.diff})
            elif result.test_outcome == TestOutcome.KILLED:
                # Cosmic Ray reports a test run past the timeout as killed, with output "timeout";
                # on a loaded machine that is no evidence, so it is counted apart and not scored.
                counts["timed_out" if result.output == "timeout" else "killed"] += 1
            else:
                counts["incompetent"] += 1
    ran = counts["killed"] + counts["survived"]
    return {**counts, "score": round(counts["killed"] / ran, 3) if ran else None, "survivors": survivors}


def run(package: str, module: str | None, sample_size: int, budget_s: float, seed: int, timeout_s: float) -> dict:
    """Mutation testing of ``package`` (or one ``module`` of it) in a worktree of HEAD."""
    tests = sorted(str(path.relative_to(HERE)) for pattern in TESTS[package] for path in HERE.glob(pattern))
    target = module or f"robustjax/{package}"
    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder, "tree")
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), "HEAD"], cwd=HERE, check=True,
                       capture_output=True)
        try:
            env = os.environ | {"PYTHONPATH": str(tree), "JAX_PLATFORMS": "cpu"}
            (tree / "mutation.toml").write_text(config(target, tests, timeout_s))
            session = Path(folder, "session.sqlite")
            subprocess.run(["cosmic-ray", "init", "mutation.toml", str(session)], cwd=tree, env=env, check=True)
            total = sample(session, sample_size, seed)
            try:
                subprocess.run(["cosmic-ray", "exec", "mutation.toml", str(session)], cwd=tree, env=env,
                               timeout=budget_s)
            except subprocess.TimeoutExpired:
                pass  # the budget is spent: what ran is scored, the rest stays pending
            return {"package": package, "module": target, "tests": tests, "mutants": total,
                    "sampled": min(sample_size, total), **outcomes(session)}
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=HERE, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", choices=sorted(TESTS))
    parser.add_argument("--module", help="one file of the package instead of all of it")
    parser.add_argument("--sample", type=int, default=40, help="mutants drawn at random (default: %(default)s)")
    parser.add_argument("--budget-minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per mutant: longer counts as timed out")
    args = parser.parse_args()
    result = run(args.package, args.module, args.sample, args.budget_minutes * 60, args.seed, args.timeout_s)
    print(f"{result['module']}: {result['killed']} killed, {result['survived']} survived, "
          f"{result['timed_out']} timed out, {result['incompetent']} incompetent, {result['pending']} not reached of {result['sampled']} sampled "
          f"({result['mutants']} mutants); score {result['score']}")
    for survivor in result["survivors"]:
        print(f"survived: {survivor['module']}:{survivor['line']} {survivor['operator']}")
    name = result["package"] if args.module is None else f"{result['package']}_{Path(args.module).stem}"
    path = RESULTS / f"mutation_{name}.json"
    path.write_text(json.dumps({"benchmark": "mutation",
                                "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                                "seed": args.seed, **result}, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
