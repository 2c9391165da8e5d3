"""Decision-based attacks, robustjax against ART, at equal query budgets: HopSkipJump and
Boundary on the digits CNN and a CIFAR ResNet-18.

    python -m benchmarks.blackbox_decision [--model digits|resnet18|all] [--batch-size N]
                                           [--repeats N] [--quick] [--out DIR]

ART runs first with an iteration count (its attacks have no query budget); a forward hook
on its torch model counts the images it sends, so its queries per example are known.
robustjax then runs with ``max_queries`` equal to ART's mean queries per example, on the
same images with the same weights. Reported per attack: wall time of each library, the
ratio, queries per second (model evaluations of single images), success rates and median
l2 distances, and the seconds ART spent inside the torch model's forward passes
(``peer_model_seconds``): at equal queries, no implementation whose model runs as fast as
torch's can beat ART by more than ``peer_seconds / peer_model_seconds``. ART runs once (it is slow and its timing is stable); robustjax's time is the
median of ``--repeats`` calls after a compiling one. One JSON file per model:
results/blackbox_decision_MODEL.BACKEND.json. ``--quick`` runs a tiny configuration to
check that the script works (not for figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import torch
from art.attacks.evasion import BoundaryAttack
from art.attacks.evasion import HopSkipJump as ArtHopSkipJump
from art.estimators.classification import PyTorchClassifier

import robustjax as rj
from benchmarks.attacks import Setup, digits_setup, resnet18_setup
from benchmarks.common import RESULTS, machine_facts, report, seconds_per_call, synchronized
from benchmarks.torch_models import to_nchw, to_nhwc
from robustjax.attacks.boundary import Boundary
from robustjax.attacks.hsja import HopSkipJump


@dataclasses.dataclass(frozen=True)
class Row:
    """One benchmarked attack: ART's configuration and ours, given a query budget."""

    name: str
    theirs: Callable[[PyTorchClassifier, bool], object]  # (classifier, quick) -> ART attack
    ours: Callable[[int], rj.attacks.Attack]  # max_queries -> robustjax attack


ROWS = (
    Row("hop_skip_jump_l2",
        lambda c, quick: ArtHopSkipJump(c, max_iter=2 if quick else 20, verbose=False),
        lambda budget: HopSkipJump(norm="l2", max_queries=budget)),
    Row("boundary",
        lambda c, quick: BoundaryAttack(c, targeted=False, max_iter=5 if quick else 200, verbose=False),
        lambda budget: Boundary(max_queries=budget)),
)
SETUPS = {"digits": (digits_setup, 16), "resnet18": (resnet18_setup, 8)}


@dataclasses.dataclass
class ModelCalls:
    """What ART's forward passes cost: the images sent and the seconds spent inside them."""

    rows: list[int] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    started: float = 0.0

    def clear(self) -> None:
        self.rows.clear()
        self.seconds = 0.0


def art_classifier(setup: Setup, calls: ModelCalls) -> PyTorchClassifier:
    """ART's wrapper of the torch twin; every forward pass adds its image count and its
    duration to ``calls``."""

    def count_and_cast(_, args):  # ART's HopSkipJump interpolates in float64
        calls.rows.append(len(args[0]))
        synchronized(None)
        calls.started = time.perf_counter()
        return (args[0].float(),)

    def stop_clock(*_):
        synchronized(None)
        calls.seconds += time.perf_counter() - calls.started

    setup.twin.register_forward_pre_hook(count_and_cast)
    setup.twin.register_forward_hook(stop_clock)
    h, w, c = setup.clf.input_shape
    return PyTorchClassifier(setup.twin, loss=torch.nn.CrossEntropyLoss(), input_shape=(c, h, w),
                             nb_classes=setup.clf.num_classes, clip_values=(0.0, 1.0),
                             device_type="gpu" if next(setup.twin.parameters()).is_cuda else "cpu")


def l2(adv: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.linalg.norm((np.asarray(adv) - x).reshape(len(x), -1), axis=1)


def measure(row: Row, setup: Setup, classifier: PyTorchClassifier, calls: ModelCalls, repeats: int, quick: bool) -> dict:
    batch = len(setup.y)
    np.random.seed(0)
    calls.clear()
    start = time.perf_counter()
    theirs = row.theirs(classifier, quick).generate(to_nchw(setup.x).numpy(), y=setup.y)
    theirs_s = time.perf_counter() - start
    theirs_queries, theirs_model_s = sum(calls.rows), calls.seconds
    with torch.no_grad():
        theirs_success = classifier.predict(theirs).argmax(1) != setup.y
    budget = max(round(theirs_queries / batch), 3)
    attack = row.ours(budget)
    results = []
    first, ours_s = seconds_per_call(
        lambda: results.append(jax.block_until_ready(attack(setup.clf, setup.x, setup.y, key=jax.random.key(0)))),
        repeats)
    ours = results[-1]
    ours_queries = int(ours.queries.sum())
    success = np.asarray(ours.success)
    theirs_adv = to_nhwc(torch.from_numpy(theirs))
    return {
        "name": row.name,
        "params": attack.params(),
        "robustjax_images_per_s": batch / ours_s,
        "peer_images_per_s": batch / theirs_s,
        "ratio": theirs_s / ours_s,
        "robustjax_compile_s": max(first - ours_s, 0.0),
        "robustjax_seconds": ours_s,
        "peer_seconds": theirs_s,
        "peer_model_seconds": theirs_model_s,
        "robustjax_queries": ours_queries,
        "peer_queries": theirs_queries,
        "robustjax_queries_per_s": ours_queries / ours_s,
        "peer_queries_per_s": theirs_queries / theirs_s,
        "robustjax_success_rate": float(success.mean()),
        "peer_success_rate": float(theirs_success.mean()),
        "robustjax_median_l2": float(np.median(l2(ours.x_adv, setup.x)[success])) if success.any() else None,
        "peer_median_l2": float(np.median(l2(theirs_adv, setup.x)[theirs_success])) if theirs_success.any() else None,
    }


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=(*SETUPS, "all"), default="all")
    parser.add_argument("--batch-size", type=int, default=None, help="default: 16 digits, 8 resnet18")
    parser.add_argument("--repeats", type=int, default=2, help="timed robustjax calls after the first (median)")
    parser.add_argument("--quick", action="store_true", help="tiny budgets, digits only, 2 images: a smoke test")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    return parser.parse_args()


def main() -> None:
    args = parse_arguments()
    facts = machine_facts(("torch", "adversarial-robustness-toolbox"))
    models = ("digits",) if args.quick else (SETUPS if args.model == "all" else (args.model,))
    for model in models:
        make_setup, default_batch = SETUPS[model]
        setup = make_setup(2 if args.quick else args.batch_size or default_batch)
        calls = ModelCalls()
        classifier = art_classifier(setup, calls)
        results = [measure(row, setup, classifier, calls, 1 if args.quick else args.repeats, args.quick)
                   for row in ROWS]
        for r in results:
            print(f"{r['name']:18s} queries/s robustjax {r['robustjax_queries_per_s']:10.0f}  ART "
                  f"{r['peer_queries_per_s']:8.0f}   median l2 {r['robustjax_median_l2']} vs {r['peer_median_l2']}")
        settings = {"model": setup.clf.name, "batch_size": len(setup.y), "repeats": args.repeats,
                    "quick": args.quick, "peer": "adversarial-robustness-toolbox",
                    "budget": "robustjax max_queries = ART's mean queries per example",
                    "torch_threads": torch.get_num_threads()}
        name = f"blackbox_decision_{setup.name}" + ("_quick" if args.quick else "")
        report(name, results, facts, settings, args.out)


if __name__ == "__main__":
    main()
