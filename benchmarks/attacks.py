"""Attack throughput, robustjax against torchattacks, on the digits CNN, a CIFAR ResNet-18 and
a user's own plain-JAX CNN.

    python -m benchmarks.attacks [--model digits|resnet18|user|all] [--batch-size N] [--repeats N]
                                 [--attacks NAME,...] [--out DIR]

Both libraries attack the same images with the same architecture and weights, on the same
device (the GPU when JAX runs on one). The digits CNN uses its trained weights on digits
images (batch 256); the ResNet-18 uses random weights on uniform random images labelled
with its own predictions (batch 128), which is enough for throughput. The user's model
(``user_cnn``, batch 128) is a plain-JAX CNN that does not use the zoo's layers, with the
weights of its torch twin: its convolutions go through ``robustjax.fast_conv`` inside the
attacks. Iterative attacks run
every step (no early stop) unless the row name says otherwise. A grid row runs the ``GRID``
multiples of the model's epsilon: robustjax as one ``sweep`` call, torchattacks as 8 runs;
an image counts once per whole grid.

The ``_early_stop`` and ``_nested`` rows run robustjax's defaults instead: each example
stops at its first successful step and only unfinished examples are computed
(compaction); the grid is a nested search (an example fooled at one epsilon is not
attacked at larger ones). torchattacks, which has no early stop, runs every step of every
example: these rows compare how long each library's PGD takes to give its robust accuracy,
and the JSON records both success rates (at equal randomness robustjax's can only be
higher: it keeps any successful step, torchattacks only the last).

CW-L2 runs 5 binary-search steps of 100 Adam steps; torchattacks' CW has no search, so it
runs 5 times (c = 0.01 to 100) for the same 500 gradient evaluations. One JSON file per
model: results/attacks_MODEL.BACKEND.json.

Equal output: a robustjax attack returns its adversarial examples and which of them fool
the model (one more forward pass, ``AttackResult.success``); torchattacks returns the
examples only, so its timed call includes the forward pass that tells which fool the
model. Each row also gives both libraries' achieved GFLOP/s and the machine's peak (a
jitted 2,048-square float32 matrix product): a library's model FLOPs are its gradient
and forward passes times the FLOPs XLA's cost analysis counts in one input gradient and
one forward pass of the model. robustjax's passes come from its ``queries`` (one input
gradient per query but the last, a forward pass); torchattacks' from its algorithm
(``Row.peer_passes``) and the check.

An attack is one line of ``ROWS``: its name, ``eps -> robustjax attack`` and
``(torch model, eps) -> torchattacks attacks`` (a list, run one after the other).
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
from benchmarks.common import (
    RESULTS,
    machine_facts,
    matmul_peak_gflops,
    model_pass_flops,
    report,
    synchronized,
    timed,
    torch_device,
)
from benchmarks.torch_models import digits_cnn_to_torch, to_nchw
from benchmarks.torch_resnet import resnet18_to_torch

STEPS = 20
GRID = tuple(k / 4 for k in range(1, 9))  # 8 epsilons, 0.25 to 2 times the model's eps


def pgd(norm: str, early_stop: bool = False) -> Callable[[float], rj.attacks.Attack]:
    return lambda eps: rj.attacks.PGD(eps=eps, norm=norm, steps=STEPS, early_stop=early_stop)


def torch_pgd(cls: type) -> Callable[[nn.Module, float], list]:
    return lambda model, eps: [cls(model, eps=eps, alpha=2.5 * eps / STEPS, steps=STEPS)]


CW_CONSTANTS = (0.01, 0.1, 1.0, 10.0, 100.0)


@dataclasses.dataclass(frozen=True)
class Row:
    """One benchmarked attack; ``norm`` picks the model's epsilon, ``grid`` runs ``GRID``;
    ``peer_passes`` counts the model passes torchattacks makes, not the benchmark's check."""

    name: str
    ours: Callable[[float], rj.attacks.Attack]
    theirs: Callable[[nn.Module, float], list]
    peer_passes: tuple[int, int]  # torchattacks' (input gradients, forward passes) per image and epsilon
    norm: str = "linf"
    grid: bool = False


ROWS = (
    Row("fgsm", lambda eps: rj.attacks.FGSM(eps=eps), lambda model, eps: [torchattacks.FGSM(model, eps=eps)], (1, 0)),
    Row("pgd20_linf", pgd("linf"), torch_pgd(torchattacks.PGD), (STEPS, 0)),
    Row("pgd20_l2", pgd("l2"), torch_pgd(torchattacks.PGDL2), (STEPS, 0), norm="l2"),
    Row("mifgsm10", lambda eps: rj.attacks.MIFGSM(eps=eps, steps=10, early_stop=False),
        lambda model, eps: [torchattacks.MIFGSM(model, eps=eps, alpha=eps / 10, steps=10)], (10, 0)),
    Row("cw_l2_100x5", lambda eps: rj.attacks.CWL2(binary_search_steps=5, steps=100, abort_early=False),
        lambda model, eps: [torchattacks.CW(model, c=c, steps=100) for c in CW_CONSTANTS],
        (100 * len(CW_CONSTANTS), 0), norm="l2"),
    # torchattacks' APGD: a clean forward pass, a gradient at the start and one per step.
    Row("apgd_ce100", lambda eps: rj.attacks.APGD(eps=eps, loss="ce", steps=100),
        lambda model, eps: [torchattacks.APGD(model, eps=eps, steps=100, loss="ce", n_restarts=1)], (101, 1)),
    Row("pgd20_linf_grid8", pgd("linf"), torch_pgd(torchattacks.PGD), (STEPS, 0), grid=True),
    Row("pgd20_linf_early_stop", pgd("linf", early_stop=True), torch_pgd(torchattacks.PGD), (STEPS, 0)),
    Row("pgd20_l2_early_stop", pgd("l2", early_stop=True), torch_pgd(torchattacks.PGDL2), (STEPS, 0), norm="l2"),
    Row("pgd20_linf_grid8_nested", pgd("linf", early_stop=True), torch_pgd(torchattacks.PGD), (STEPS, 0),
        grid=True),
)


@dataclasses.dataclass(frozen=True)
class Setup:
    """A model, its torch twin, a batch and the epsilon of each norm."""

    name: str
    clf: rj.Classifier
    twin: nn.Module
    x: np.ndarray
    y: np.ndarray
    eps: dict[str, float]


def digits_setup(batch_size: int) -> Setup:
    clf = rj.zoo.create("digits_cnn")
    x, y = rj.data.digits("all").arrays(limit=batch_size)
    return Setup("digits", clf, digits_cnn_to_torch(clf).to(torch_device()), x, y, {"linf": 0.1, "l2": 1.0})


def resnet18_setup(batch_size: int) -> Setup:
    clf = rj.zoo.create("resnet18_cifar", pretrained=False)
    x = np.random.default_rng(0).uniform(size=(batch_size, *clf.input_shape)).astype(np.float32)
    y = np.array(jax.jit(lambda c, images: c(images).argmax(-1))(clf, x), np.int32)  # writable, for torch
    return Setup("resnet18", clf, resnet18_to_torch(clf).to(torch_device()), x, y, {"linf": 8 / 255, "l2": 0.5})


def user_cnn(params, x):
    """A user's own model, not from the zoo: two 3x3 ``lax`` convolutions (16 and 32
    channels) and a dense head in plain JAX, flattened in torch's channel-first order."""
    numbers = ("NHWC", "HWIO", "NHWC")
    h = jax.nn.relu(jax.lax.conv_general_dilated(x, params["k1"], (1, 1), "SAME", dimension_numbers=numbers)
                    + params["b1"])
    h = jax.nn.relu(jax.lax.conv_general_dilated(h, params["k2"], (1, 1), "SAME", dimension_numbers=numbers)
                    + params["b2"])
    return h.transpose(0, 3, 1, 2).reshape(h.shape[0], -1) @ params["w"] + params["b"]


def user_setup(batch_size: int) -> Setup:
    """:func:`user_cnn` with torch's default initialisation (the twin's weights) on digits
    images labelled with its own predictions (the model is untrained: throughput only)."""
    torch.manual_seed(0)
    twin = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(32 * 8 * 8, 10)).eval()
    weights = {name: value.detach().numpy() for name, value in twin.state_dict().items()}
    params = {"k1": weights["0.weight"].transpose(2, 3, 1, 0), "b1": weights["0.bias"],
              "k2": weights["2.weight"].transpose(2, 3, 1, 0), "b2": weights["2.bias"],
              "w": weights["5.weight"].T, "b": weights["5.bias"]}
    clf = rj.Classifier(params=jax.tree.map(jax.numpy.asarray, params), apply_fn=user_cnn, num_classes=10,
                        input_shape=(8, 8, 1), name="user_cnn")
    x, _ = rj.data.digits("all").arrays(limit=batch_size)
    y = np.array(jax.jit(lambda c, images: c(images).argmax(-1))(clf, x), np.int32)  # writable, for torch
    return Setup("user_cnn", clf, twin.to(torch_device()), x, y, {"linf": 0.1, "l2": 1.0})


SETUPS = {"digits": (digits_setup, 256), "resnet18": (resnet18_setup, 128), "user": (user_setup, 128)}


def run_ours(attack, epsilons, clf, x, y, key) -> rj.attacks.AttackResult:
    """One call; a grid is one vmapped sweep over its epsilons."""
    if len(epsilons) > 1:
        return jax.block_until_ready(attack.sweep(clf, x, y, key=key, eps=epsilons))
    return jax.block_until_ready(attack(clf, x, y, key=key))


def attacked_and_fooled(attacks: list, model: nn.Module, x, y) -> list[tuple]:
    """torchattacks' adversarial examples, each with the model's verdict on them (fooled or not)."""
    results = []
    for attack in attacks:
        adv = attack(x, y)
        with torch.no_grad():
            results.append((adv, model(adv).argmax(1) != y))
    return synchronized(results)


def measure(row: Row, setup: Setup, repeats: int, peak_gflops: float) -> dict:
    """Times one row on one model; success rates come from each library's last timed call."""
    eps = setup.eps[row.norm]
    epsilons = [eps * k for k in GRID] if row.grid else [eps]
    ours = row.ours(eps)
    theirs = [attack for e in epsilons for attack in row.theirs(setup.twin, e)]
    device = next(setup.twin.parameters()).device
    x_torch, y_torch = to_nchw(setup.x).to(device), torch.from_numpy(setup.y).long().to(device)
    key = jax.random.key(0)
    first, ours_s, ours_result = timed(lambda: run_ours(ours, epsilons, setup.clf, setup.x, setup.y, key), repeats)
    _, theirs_s, theirs_out = timed(lambda: attacked_and_fooled(theirs, setup.twin, x_torch, y_torch), repeats)
    theirs_success = np.mean([fooled.cpu().numpy() for _, fooled in theirs_out])
    forward, gradient = model_pass_flops(setup.clf, setup.x, setup.y)
    queries = np.asarray(ours_result.queries, np.float64)  # (epsilons,) batch
    ours_flops = (queries - 1).clip(0).sum() * gradient + queries.size * forward
    gradients, forwards = row.peer_passes
    # An image's passes per epsilon: the attack's (CW's once per constant, already counted) and the check.
    theirs_flops = len(epsilons) * len(setup.y) * (gradients * gradient + (forwards + len(theirs) // len(epsilons))
                                                   * forward)
    batch = len(setup.y)
    return {
        "name": row.name,
        "params": ours.params() | ({"eps_grid": epsilons} if row.grid else {}),
        "robustjax_images_per_s": batch / ours_s,
        "peer_images_per_s": batch / theirs_s,
        "ratio": theirs_s / ours_s,
        "robustjax_compile_s": max(first - ours_s, 0.0),
        "robustjax_success_rate": float(np.mean(ours_result.success)),
        "peer_success_rate": float(theirs_success),
        "robustjax_mean_queries": float(queries.mean()),
        "robustjax_gflops": ours_flops / ours_s / 1e9,
        "peer_gflops": theirs_flops / theirs_s / 1e9,
        "peak_gflops": peak_gflops,
        "forward_mflop_per_image": forward / 1e6,
        "gradient_mflop_per_image": gradient / 1e6,
    }


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=(*SETUPS, "all"), default="all")
    parser.add_argument("--batch-size", type=int, default=None, help="default: 256 digits, 128 resnet18 and user")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after the first (median taken)")
    parser.add_argument("--attacks", default=",".join(r.name for r in ROWS), help="comma-separated rows")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    known = {r.name for r in ROWS}
    if unknown := sorted(set(args.attacks.split(",")) - known):
        parser.error(f"unknown attacks {unknown}; known: {sorted(known)}")
    return args


def main() -> None:
    args = parse_arguments()
    rows = [r for r in ROWS if r.name in args.attacks.split(",")]
    facts = machine_facts(("torch", "torchattacks"))
    peak = matmul_peak_gflops()
    for model in SETUPS if args.model == "all" else (args.model,):
        make_setup, default_batch = SETUPS[model]
        setup = make_setup(args.batch_size or default_batch)
        results = [measure(row, setup, args.repeats, peak) for row in rows]
        settings = {"model": setup.clf.name, "batch_size": len(setup.y), "repeats": args.repeats,
                    "eps": setup.eps, "peer": "torchattacks", "torch_threads": torch.get_num_threads(),
                    "torch_device": torch_device()}
        report(f"attacks_{setup.name}", results, facts, settings, args.out)


if __name__ == "__main__":
    main()
