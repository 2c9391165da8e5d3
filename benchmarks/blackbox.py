"""Black-box attack throughput, robustjax against torchattacks and ART, at equal query budgets.

    python -m benchmarks.blackbox [--model digits|resnet18|all] [--batch-size N] [--queries N]
                                  [--repeats N] [--rows NAME,...] [--out DIR]

Every library attacks the same images with the same architecture and weights (the torch
twins of ``benchmarks.attacks``) and makes the same number of attack queries per image:
``--queries`` square proposals for Square (robustjax's ``max_queries`` adds its clean
check, start point and final check). Each library stops an image once it is fooled. A row
reports images/s, robustjax's queries/s (the queries it counted, over the wall time), the
success rates and the median perturbation norm of the successful images. One JSON file per
model: results/blackbox_MODEL.BACKEND.json.

An attack is one line of ``ROWS``: its name, its norm, ``(eps, queries) -> robustjax
attack`` and, per peer, ``(torch model, classifier, eps, queries) -> run(x, y)`` on NHWC
numpy arrays.
Rows for decision-based attacks (HopSkipJump, Boundary) belong in the same table.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import torch
import torchattacks
from torch import nn

import robustjax as rj
from benchmarks.attacks import SETUPS, Setup
from benchmarks.common import (
    RESULTS,
    machine_facts,
    report,
    seconds_per_call,
    synchronized,
    torch_device,
)
from benchmarks.torch_models import to_nchw, to_nhwc
from robustjax.attacks import threat
from robustjax.attacks.square import Square

Run = Callable[[np.ndarray, np.ndarray], np.ndarray]
Peer = Callable[[nn.Module, rj.Classifier, float, int], Run]  # (twin, classifier, eps, queries) -> run


def torchattacks_square(norm: str) -> Peer:
    def make(model: nn.Module, clf: rj.Classifier, eps: float, queries: int) -> Run:
        attack = torchattacks.Square(model, norm={"linf": "Linf", "l2": "L2"}[norm], eps=eps, n_queries=queries,
                                     p_init=0.8, seed=0)
        device = next(model.parameters()).device

        def run(x, y):
            adv = attack(to_nchw(x).to(device), torch.from_numpy(np.array(y)).long().to(device))
            return to_nhwc(synchronized(adv).cpu())

        return run

    return make


def art_square(norm: str) -> Peer:
    def make(model: nn.Module, clf: rj.Classifier, eps: float, queries: int) -> Run:
        from art.attacks.evasion import SquareAttack
        from art.estimators.classification import PyTorchClassifier

        height, width, channels = clf.input_shape
        classifier = PyTorchClassifier(
            model, loss=nn.CrossEntropyLoss(), input_shape=(channels, height, width), nb_classes=clf.num_classes,
            clip_values=(0.0, 1.0), device_type="cpu" if torch_device() == "cpu" else "gpu",
        )

        def run(x, y):
            attack = SquareAttack(classifier, norm=np.inf if norm == "linf" else 2, max_iter=queries, eps=eps,
                                  p_init=0.8, nb_restarts=1, batch_size=len(x), verbose=False)
            return attack.generate(to_nchw(x).numpy(), y=np.array(y)).transpose(0, 2, 3, 1)

        return run

    return make


@dataclasses.dataclass(frozen=True)
class Row:
    """One benchmarked attack, against each of ``peers``."""

    name: str
    norm: str
    ours: Callable[[float, int], rj.attacks.Attack]
    peers: dict[str, Peer]


ROWS = (
    Row("square_linf", "linf", lambda eps, queries: Square(eps=eps, max_queries=queries + 3),
        {"torchattacks": torchattacks_square("linf"), "art": art_square("linf")}),
    Row("square_l2", "l2", lambda eps, queries: Square(eps=eps, norm="l2", max_queries=queries + 3),
        {"torchattacks": torchattacks_square("l2"), "art": art_square("l2")}),
)


def median_norm(x_adv: np.ndarray, x: np.ndarray, success: np.ndarray, norm: str) -> float | None:
    """Median ``norm`` of the successful perturbations (None when none succeeded)."""
    norms = np.asarray(threat.per_example_norm(np.asarray(x_adv) - x, norm))[success]
    return float(np.median(norms)) if success.any() else None


def measure(row: Row, peer: str, setup: Setup, queries: int, repeats: int) -> dict:
    """Times one row against one peer; quality figures come from each side's last call."""
    eps = setup.eps[row.norm]
    ours, theirs = row.ours(eps, queries), row.peers[peer](setup.twin, setup.clf, eps, queries)
    key = jax.random.key(0)
    results = []
    first, ours_s = seconds_per_call(
        lambda: results.append(jax.block_until_ready(ours(setup.clf, setup.x, setup.y, key=key))), repeats)
    adversarial = []
    _, theirs_s = seconds_per_call(lambda: adversarial.append(theirs(setup.x, setup.y)), repeats)
    result, x_theirs = results[-1], adversarial[-1]
    predict = jax.jit(lambda c, images: c(images).argmax(-1))
    theirs_success = np.asarray(predict(setup.clf, x_theirs)) != setup.y
    ours_success = np.asarray(result.success)
    batch = len(setup.y)
    return {
        "name": f"{row.name}_vs_{peer}",
        "peer": peer,
        "params": ours.params(),
        "peer_queries": queries,
        "robustjax_images_per_s": batch / ours_s,
        "peer_images_per_s": batch / theirs_s,
        "ratio": theirs_s / ours_s,
        "robustjax_compile_s": max(first - ours_s, 0.0),
        "robustjax_queries_per_s": float(np.sum(result.queries)) / ours_s,
        "robustjax_median_queries": float(np.median(result.queries)),
        "robustjax_success_rate": float(ours_success.mean()),
        "peer_success_rate": float(theirs_success.mean()),
        "robustjax_median_norm": median_norm(result.x_adv, setup.x, ours_success, row.norm),
        "peer_median_norm": median_norm(x_theirs, setup.x, theirs_success, row.norm),
    }


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=(*SETUPS, "all"), default="digits")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--queries", type=int, default=1000, help="attack queries per image")
    parser.add_argument("--repeats", type=int, default=1, help="timed calls after the first (median taken)")
    parser.add_argument("--rows", default=",".join(r.name for r in ROWS), help="comma-separated rows")
    parser.add_argument("--peers", default="torchattacks,art", help="comma-separated peers")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    known = {r.name for r in ROWS}
    if unknown := sorted(set(args.rows.split(",")) - known):
        parser.error(f"unknown rows {unknown}; known: {sorted(known)}")
    return args


def main() -> None:
    args = parse_arguments()
    rows = [r for r in ROWS if r.name in args.rows.split(",")]
    peers = args.peers.split(",")
    facts = machine_facts(("torch", "torchattacks", "adversarial-robustness-toolbox"))
    for model in SETUPS if args.model == "all" else (args.model,):
        make_setup, _ = SETUPS[model]
        setup = make_setup(args.batch_size)
        results = [measure(row, peer, setup, args.queries, args.repeats)
                   for row in rows for peer in peers if peer in row.peers]
        settings = {"model": setup.clf.name, "batch_size": len(setup.y), "queries": args.queries,
                    "repeats": args.repeats, "eps": setup.eps, "torch_threads": torch.get_num_threads(),
                    "torch_device": torch_device()}
        report(f"blackbox_{setup.name}", results, facts, settings, args.out)


if __name__ == "__main__":
    main()
