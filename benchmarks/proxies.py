"""Training-free robustness proxies over a NAS-Bench-201 digits population: robustjax's
``proxies.population`` (every network in one program) against torch one network at a time.

    python -m benchmarks.proxies [--networks 32] [--batch 32] [--quick] [--out DIR]

``--networks`` random cells of ``nb201_digits`` (C=8, N=1, 8x8 grey digits), each a
standalone network with its own random initialisation (``nas.trainable.trainable``, key i
for cell i, eval mode, as ``benchmarks/training_population.py`` builds them), stacked with
``Classifier.stack`` in the side-by-side layout (every edge computes its five ops and its
one-hot op weights select one: the cell's own network), on the first ``--batch`` test
digits. The peer is xautodl's ``TinyNetwork`` holding each cell's own weights
(``benchmarks/torch_nb201.py``), in eval mode, one network after another; the twins are
built before the clock starts, as the stack is.

Three proxies, the same definitions on both sides:

- input-Jacobian Frobenius norm of the logits per image (``proxies.jacobian_norm``); torch:
  one backward pass per class through the logits of one forward pass;
- the input-Hessian's dominant eigenvalue of the cross-entropy per image by power
  iteration (``proxies.hessian_eigenvalue``, ``--iterations`` = 20, unrolled on the CPU as
  the library's default); torch: Hessian-vector products by double backward from one
  ``create_graph`` gradient, from the same start vectors (robustjax's: ``jax.random.normal``
  of the key, per image at unit norm; the same key for every network), the last
  iteration's Rayleigh quotient;
- the condition number of the B x B empirical NTK of the summed logits over every
  trainable parameter (``proxies.ntk_condition_number``; batch-norm statistics excluded,
  ``inf`` below the same rank threshold); torch: ``torch.func.jacrev`` of the summed logits
  with respect to the parameters (``functional_call``), ``J J^T``, ``eigvalsh`` in float32.

Rows: networks/hour each side and the ratio (above 1: robustjax is faster), robustjax's
compile seconds (its first call's excess over the warm call, which is what is timed), the
largest relative difference between the two sides' values, and a total over the three.
CLEVER is not compared (its reverse-Weibull fit runs on the host and dominates); an extra
row times robustjax's ``clever_samples`` over the population (``--clever-examples`` images,
``--clever-batches`` x ``--clever-samples`` points, L2 radius 0.5), no peer. torch runs
with ``--threads`` threads (default: the machine's cores). Results: results/proxies.BACKEND.json.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import jax
import numpy as np
import torch
from flax import nnx

import robustjax as rj
from benchmarks.common import RESULTS, machine_facts, timed, write_json
from benchmarks.torch_models import Normalized, to_nchw
from benchmarks.torch_nb201 import tiny_network
from robustjax.metrics import proxies as px
from robustjax.nas.trainable import standalone_network, trainable

SPACE = "nb201_digits"
CLEVER_RADIUS = 0.5


# --------------------------------------------------------------------------- the population


def networks(space, cells: list[int]) -> tuple[rj.Classifier, list[torch.nn.Module]]:
    """The cells' networks stacked for robustjax, and their torch twins (same weights)."""
    nets = [trainable(space, cell, key=jax.random.key(i)) for i, cell in enumerate(cells)]
    twins = []
    for cell, net in zip(cells, nets):
        weights = nnx.to_pure_dict(standalone_network(space, cell, net).params)
        twins.append(Normalized(tiny_network(space, space.resolve(cell), weights), space.mean, space.std).eval())
    return rj.Classifier.stack(nets, name=f"{len(cells)} {SPACE} cells"), twins


def start_vectors(key: jax.Array, shape: tuple[int, ...]) -> np.ndarray:
    """The power iteration's start: a standard normal draw of ``key`` at unit norm per image,
    as ``proxies.hessian_eigenvalue`` draws it."""
    v = np.array(jax.random.normal(key, shape, np.float32))
    return v / np.maximum(np.linalg.norm(v.reshape(len(v), -1), axis=1), 1e-30).reshape((-1,) + (1,) * (v.ndim - 1))


# --------------------------------------------------------------------------- torch, one network at a time


def torch_jacobian_norm(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    images = x.clone().requires_grad_(True)
    logits = model(images)
    squared = torch.zeros(len(x))
    for k in range(logits.shape[1]):
        (gradient,) = torch.autograd.grad(logits[:, k].sum(), images, retain_graph=True)
        squared += gradient.pow(2).flatten(1).sum(1)
    return squared.sqrt().numpy()


def torch_hessian_eigenvalue(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, start: torch.Tensor,
                             iterations: int) -> np.ndarray:
    images = x.clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(model(images), y, reduction="sum")
    (gradient,) = torch.autograd.grad(loss, images, create_graph=True)
    v, quotient = start, None
    for _ in range(iterations):
        (hv,) = torch.autograd.grad(gradient, images, grad_outputs=v, retain_graph=True)
        quotient = (v * hv).flatten(1).sum(1)
        v = hv / hv.flatten(1).norm(dim=1).clamp_min(1e-30).view((-1,) + (1,) * (hv.ndim - 1))
    return quotient.detach().numpy()


def torch_ntk_condition_number(model: torch.nn.Module, x: torch.Tensor) -> float:
    params = {name: p.detach() for name, p in model.named_parameters()}

    def summed_logits(p):
        return torch.func.functional_call(model, p, (x,)).sum(-1)

    jacobians = torch.func.jacrev(summed_logits)(params)
    kernel = sum(j.flatten(1) @ j.flatten(1).T for j in jacobians.values())
    eigenvalues = torch.linalg.eigvalsh(kernel)
    resolution = len(x) * torch.finfo(eigenvalues.dtype).eps * eigenvalues[-1]
    return float(eigenvalues[-1] / eigenvalues[0]) if eigenvalues[0] > resolution else float("inf")


def torch_seconds(compute, twins: list[torch.nn.Module]) -> tuple[float, np.ndarray]:
    """Seconds for ``compute(model)`` over every twin, one after another (after one untimed
    call that warms torch's allocator), and the stacked values."""
    compute(twins[0])
    start = time.perf_counter()
    values = [compute(model) for model in twins]
    return time.perf_counter() - start, np.stack([np.asarray(v, np.float64) for v in values])


# --------------------------------------------------------------------------- comparison


def relative_difference(ours: np.ndarray, theirs: np.ndarray) -> dict:
    """The largest and the median |ours - theirs| / |theirs| over every network and image (0
    where both are infinite: a singular kernel on both sides), and the two values at the
    largest (a value near 0 has float32's absolute error for its scale)."""
    ours, theirs = np.asarray(ours, np.float64).ravel(), np.asarray(theirs, np.float64).ravel()
    both_infinite = np.isinf(ours) & np.isinf(theirs) & (np.sign(ours) == np.sign(theirs))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(both_infinite, 0.0, np.abs(ours - theirs) / np.maximum(np.abs(theirs), 1e-30))
    worst = int(np.argmax(ratio))
    return {"max_relative_difference": float(ratio[worst]), "median_relative_difference": float(np.median(ratio)),
            "largest_at": {"robustjax": float(ours[worst]), "peer": float(theirs[worst])}}


def row(name: str, count: int, batch: int, first: float, warm: float, peer_s: float | None = None) -> dict:
    entry = {"name": name, "networks": count, "batch": batch, "robustjax_seconds": warm,
             "robustjax_compile_s": max(first - warm, 0.0), "robustjax_networks_per_hour": 3600 * count / warm,
             "robustjax_images_per_s": count * batch / warm}
    if peer_s is not None:
        entry |= {"peer_seconds": peer_s, "peer_networks_per_hour": 3600 * count / peer_s,
                  "peer_images_per_s": count * batch / peer_s, "ratio": peer_s / warm}
    return entry


def summary(values: np.ndarray) -> dict:
    finite = values[np.isfinite(values)]
    return {"median": float(np.median(finite)) if finite.size else None, "min": float(finite.min()) if finite.size else None,
            "max": float(finite.max()) if finite.size else None, "infinite": int(np.sum(~np.isfinite(values)))}


def measure(args) -> list[dict]:
    space = rj.nas.space(SPACE)
    cells = [int(i) for i in np.random.default_rng(0).choice(len(space), args.networks, replace=False)]
    stack, twins = networks(space, cells)
    x, y = rj.data.digits("test").arrays(limit=args.batch)
    key = jax.random.key(0)
    images, labels = to_nchw(x), torch.from_numpy(y.astype(np.int64))
    start = torch.from_numpy(np.ascontiguousarray(start_vectors(key, x.shape).transpose(0, 3, 1, 2)))

    proxies = {
        "jacobian_norm": (lambda: px.population(px.jacobian_norm, stack, x),
                          lambda model: torch_jacobian_norm(model, images)),
        f"hessian_eigenvalue_{args.iterations}_iterations": (
            lambda: px.population(px.hessian_eigenvalue, stack, x, y, key=key, iterations=args.iterations),
            lambda model: torch_hessian_eigenvalue(model, images, labels, start, args.iterations)),
        "ntk_condition_number": (lambda: px.population(px.ntk_condition_number, stack, x),
                                 lambda model: torch_ntk_condition_number(model, images)),
    }
    rows, total = [], {"first": 0.0, "warm": 0.0, "peer": 0.0}
    for name, (ours, theirs) in proxies.items():
        first, warm, mine = timed(lambda ours=ours: np.asarray(jax.block_until_ready(ours()), np.float64), args.repeats)
        peer_s, peer_values = torch_seconds(theirs, twins)
        rows.append(row(name, len(cells), args.batch, first, warm, peer_s) | relative_difference(mine, peer_values)
                    | {"robustjax_values": summary(mine), "peer_values": summary(peer_values)})
        total = {"first": total["first"] + first, "warm": total["warm"] + warm, "peer": total["peer"] + peer_s}
        print(f"{name}: robustjax {rows[-1]['robustjax_networks_per_hour']:.0f} networks/h (compile "
              f"{rows[-1]['robustjax_compile_s']:.1f} s), torch {rows[-1]['peer_networks_per_hour']:.0f}, "
              f"ratio {rows[-1]['ratio']:.2f}, max relative difference {rows[-1]['max_relative_difference']:.1e}",
              flush=True)
    rows.append(row("all_three", len(cells), args.batch, total["first"], total["warm"], total["peer"])
                | {key: max(r[key] for r in rows) for key in ("max_relative_difference", "median_relative_difference")})
    if args.clever_batches:
        clever_x = x[:args.clever_examples]

        def clever():
            return jax.block_until_ready(px.population(
                px.clever_samples, stack, clever_x, key=key, radius=CLEVER_RADIUS, batches=args.clever_batches,
                samples=args.clever_samples))

        first, warm, _ = timed(clever, args.repeats)
        rows.append(row(f"clever_samples_{args.clever_batches}x{args.clever_samples}", len(cells), len(clever_x),
                        first, warm) | {"peer": None, "radius": CLEVER_RADIUS, "norm": "l2",
                                        "note": "sampling only (the host's reverse-Weibull fit excluded); no peer"})
    return rows, cells


# --------------------------------------------------------------------------- main


def write(rows: list[dict], facts: dict, settings: dict, out: Path) -> Path:
    print(f"{'proxy':36s} {'robustjax networks/h':>21s} {'torch networks/h':>17s} {'ratio':>6s} {'compile s':>10s} "
          f"{'max rel diff':>13s}")
    for r in rows:
        peer = (f"{r['peer_networks_per_hour']:17.0f} {r['ratio']:6.2f}" if "ratio" in r else f"{'-':>17s} {'-':>6s}")
        difference = f"{r['max_relative_difference']:13.1e}" if "max_relative_difference" in r else f"{'-':>13s}"
        print(f"{r['name']:36s} {r['robustjax_networks_per_hour']:21.0f} {peer} {r['robustjax_compile_s']:10.1f} "
              f"{difference}")
    return write_json("proxies", rows, facts, settings, out)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", type=int, default=32, help="random cells in the population")
    parser.add_argument("--batch", type=int, default=32, help="test digits every proxy sees")
    parser.add_argument("--iterations", type=int, default=20, help="power iterations of the Hessian eigenvalue")
    parser.add_argument("--clever-examples", type=int, default=2, help="images CLEVER samples around")
    parser.add_argument("--clever-batches", type=int, default=4, help="CLEVER's batches (0: skip its row)")
    parser.add_argument("--clever-samples", type=int, default=8, help="points per CLEVER batch")
    parser.add_argument("--repeats", type=int, default=1, help="warm robustjax calls timed (median)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 networks, 4 images, 3 power iterations, no CLEVER row, torch on 1 thread")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads (default: the machine's cores, %(default)s)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    if args.quick:
        args.networks, args.batch, args.iterations = 2, 4, 3
        args.clever_batches = 0  # its compile would be a fifth of the smoke run
        args.threads = 1  # a smoke run beside other jobs: torch's spinning threads would only slow it
    return args


def main() -> None:
    args = parse_arguments()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    rows, cells = measure(args)
    settings = dict(vars(args), out=str(args.out), space=SPACE, cells=cells, layout="masks (Classifier.stack of "
                    "nas.trainable networks under jax.vmap)", clever_radius=CLEVER_RADIUS, torch_threads=args.threads,
                    peer="xautodl TinyNetwork twins with torch.autograd / torch.func, one network at a time",
                    load_average_1min_before_after=[load_before, os.getloadavg()[0]])
    write(rows, machine_facts(("torch", "xautodl")), settings, args.out)


if __name__ == "__main__":
    main()
