"""AutoAttack, robustjax against torchattacks, with the published ``standard`` budgets.

    python -m benchmarks.autoattack [--model digits|resnet18] [--batch-size N] [--eps E,...]
                                    [--steps N] [--queries N] [--repeats N] [--out DIR]

Both libraries run the ``standard`` ensemble (APGD-CE, APGD-T against the 9 highest wrong
classes, FAB-T, Square) with the same budgets (``--steps`` iterations, ``--queries`` Square
queries; torchattacks' own default is 10 iterations, set here to the same number) on the
same images, architecture and weights, and both give each component only the examples
still robust. robustjax is timed twice: called on arrays (the components run on
the still-robust examples, gathered into batches of a few sizes) and inside ``jax.jit`` (one
program, every component on the whole batch). A row per epsilon reports images/s, the ratio
of the first form to torchattacks, compile time and both robust accuracies.

Each component is also timed alone, in both libraries, on the same examples: those still
robust after robustjax's earlier components (for APGD-T and FAB-T, every one of the 9 target
classes, each on the examples not yet fooled, as both libraries run them). The row's
``components`` lists each one's images in, seconds in both libraries, their ratio, and how
many of those examples each library fooled.
Results: results/autoattack_MODEL.BACKEND.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import jax
import numpy as np
import torch
import torchattacks

import robustjax as rj
from benchmarks.attacks import SETUPS
from benchmarks.common import RESULTS, machine_facts, report, seconds_per_call, synchronized
from benchmarks.torch_models import to_nchw, to_nhwc

COMPONENTS = ("apgd_ce", "apgd_t", "fab_t", "square")  # the standard version's order, in both libraries


@dataclasses.dataclass(frozen=True)
class OneComponent(rj.attacks.AutoAttack):
    """One component of the ensemble, run as the ensemble runs it (on the examples still
    robust, each target class on those not yet fooled)."""

    index: int = 0

    def components(self, num_classes: int):
        return (super().components(num_classes)[self.index],)


def time_components(setup, ensemble: rj.attacks.AutoAttack, peers: list, repeats: int) -> list[dict]:
    """Each component alone in both libraries on the examples still robust after
    robustjax's earlier components."""
    robust = np.argmax(np.asarray(setup.clf(setup.x)), -1) == setup.y
    device = next(setup.twin.parameters()).device
    rows = []
    for index, (name, peer) in enumerate(zip(COMPONENTS, peers, strict=True)):
        chosen = np.flatnonzero(robust)
        row = {"component": name, "images": int(chosen.size)}
        if chosen.size:
            x, y = setup.x[chosen], setup.y[chosen]
            ours = OneComponent(**dataclasses.asdict(ensemble), index=index)
            results = []
            first, ours_s = seconds_per_call(
                lambda: results.append(jax.block_until_ready(ours(setup.clf, x, y, key=jax.random.key(index)))),
                repeats)
            start = time.perf_counter()
            adversarial = synchronized(peer(to_nchw(x).to(device), torch.from_numpy(y).long().to(device)))
            theirs_s = time.perf_counter() - start
            fooled = np.asarray(results[-1].success)
            row.update(robustjax_s=ours_s, peer_s=theirs_s, ratio=theirs_s / ours_s,
                       robustjax_compile_s=max(first - ours_s, 0.0), robustjax_fooled=int(fooled.sum()),
                       peer_fooled=int(np.sum(np.argmax(setup.clf(to_nhwc(adversarial.cpu())), -1) != y)))
            robust[chosen[fooled]] = False
        rows.append(row)
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
    return rows


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=tuple(SETUPS), default="digits")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--eps", default="0.1,0.2", help="comma-separated Linf radii")
    parser.add_argument("--steps", type=int, default=100, help="APGD and FAB iterations (published: 100)")
    parser.add_argument("--queries", type=int, default=5000, help="Square queries (published: 5000)")
    parser.add_argument("--repeats", type=int, default=1, help="timed robustjax calls after the first (median)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.eps = [float(e) for e in args.eps.split(",")]
    return args


def main() -> None:
    args = parse_arguments()
    setup = SETUPS[args.model][0](args.batch_size)
    device = next(setup.twin.parameters()).device
    x_torch, y_torch = to_nchw(setup.x).to(device), torch.from_numpy(np.array(setup.y)).long().to(device)
    rows = []
    for eps in args.eps:
        ours = rj.attacks.AutoAttack(eps=eps, steps=args.steps, square_queries=args.queries)
        jitted = jax.jit(lambda clf, x, y, key, attack=ours: attack(clf, x, y, key=key))
        results = {}

        def call(form, attack=ours, jitted=jitted):
            run = attack if form == "arrays" else lambda clf, x, y, key: jitted(clf, x, y, key)
            results[form] = jax.block_until_ready(run(setup.clf, setup.x, setup.y, key=jax.random.key(0)))

        first, ours_s = seconds_per_call(lambda: call("arrays"), args.repeats)
        jit_first, jit_s = seconds_per_call(lambda: call("jit"), args.repeats)
        theirs = torchattacks.AutoAttack(setup.twin, norm="Linf", eps=eps, version="standard",
                                         n_classes=setup.clf.num_classes, seed=0)
        for component in theirs._autoattack.attacks:  # the published budgets, as ours
            if hasattr(component, "steps"):
                component.steps = args.steps
            if hasattr(component, "n_queries"):
                component.n_queries = args.queries
        start = time.perf_counter()
        adversarial = to_nhwc(synchronized(theirs(x_torch, y_torch)).cpu())  # one run: it takes minutes
        theirs_s = time.perf_counter() - start
        theirs_robust = float(np.mean(np.argmax(setup.clf(adversarial), -1) == setup.y))
        batch = len(setup.y)
        rows.append({
            "name": f"autoattack_linf_{eps:g}",
            "eps": eps,
            "robustjax_images_per_s": batch / ours_s,
            "peer_images_per_s": batch / theirs_s,
            "ratio": theirs_s / ours_s,
            "robustjax_compile_s": max(first - ours_s, 0.0),
            "robustjax_jit_images_per_s": batch / jit_s,
            "robustjax_jit_compile_s": max(jit_first - jit_s, 0.0),
            "robustjax_robust_accuracy": float(np.mean(~np.asarray(results["arrays"].success))),
            "robustjax_jit_robust_accuracy": float(np.mean(~np.asarray(results["jit"].success))),
            "peer_robust_accuracy": theirs_robust,
        })
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()})
        rows[-1]["components"] = time_components(setup, ours, theirs._autoattack.attacks, max(args.repeats, 1))
    settings = {"model": setup.clf.name, "batch_size": args.batch_size, "steps": args.steps,
                "square_queries": args.queries, "version": "standard", "repeats": args.repeats,
                "peer": "torchattacks", "torch_threads": torch.get_num_threads()}
    report(f"autoattack_{args.model}", rows, machine_facts(("torch", "torchattacks")), settings, args.out)


if __name__ == "__main__":
    main()
