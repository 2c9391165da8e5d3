"""Neuron coverage and EBD on a CIFAR ResNet-18: robustjax against NumPy/PyTorch.

    python -m benchmarks.metrics [--num-examples N] [--batch-size B] [--ebd-examples N]
                                 [--directions M] [--repeats R] [--quick] [--out DIR]

Coverage: profile per-neuron bounds over N images, then KMNC (k=20), NBC, SNAC and TKNC
(k=3) over the same N images, neurons = channels (spatial means) of the stem, the eight
residual blocks and the linear head. robustjax streams jitted ``update`` calls of
``NeuronBounds``, ``KMultisectionCoverage``, ``BoundaryCoverage`` and ``TopKCoverage``;
the peer runs the PyTorch twin (``benchmarks/torch_resnet.py``) with forward hooks and
computes the same definitions in NumPy. EBD: M random orthonormal directions, the toolkit's
64-magnitude grid, both sides scanning magnitudes upwards for all directions, each image
until it flips: the peer drops the flipped images at each magnitude, robustjax moves the
images left into batches of half the size (``ops.pending``), at most about twice the
peer's work. Images are uniform noise (weights are random,
``pretrained=False``). Each row reports images/s, the ratio and the largest difference
between the two results. Results: results/metrics.BACKEND.json.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch

import robustjax as rj
from benchmarks.common import RESULTS, machine_facts, report, synchronized, torch_device
from benchmarks.torch_resnet import resnet18_to_torch
from robustjax.metrics import coverage as cov
from robustjax.metrics import structure as st

LAYERS = ("bn1",) + tuple(f"layer{s}.{b}" for s in range(1, 5) for b in range(2)) + ("linear",)
KMNC_K, TKNC_K = 20, 3


def timed(run):
    start = time.perf_counter()
    value = run()
    return value, time.perf_counter() - start


# --------------------------------------------------------------------------- robustjax


def neuron_values(clf, x):
    return cov.neuron_values(clf.features(x), LAYERS)


@jax.jit
def profile(clf, bounds, x):
    return bounds.update(neuron_values(clf, x))


@jax.jit
def cover(clf, accs, x):
    values = neuron_values(clf, x)
    return tuple(acc.update(values) for acc in accs)


def robustjax_coverage(clf, batches):
    """Streams the bounds, then the coverage accumulators, one jitted call per batch."""
    widths = {name: int(a.shape[1]) for name, a in jax.eval_shape(neuron_values, clf, batches[0]).items()}
    bounds = cov.NeuronBounds.empty(widths)
    for x in batches:
        bounds = profile(clf, bounds, x)
    accs = (cov.KMultisectionCoverage.empty(bounds, KMNC_K), cov.BoundaryCoverage.empty(bounds),
            cov.TopKCoverage.empty(widths, TKNC_K))
    for x in batches:
        accs = cover(clf, accs, x)
    results = {name: value for acc in accs for name, value in acc.compute().items()}
    return np.array([float(results[name]) for name in ("kmnc", "nbc", "snac", "tknc")])


# --------------------------------------------------------------------------- peer


def torch_neurons(model, device):
    """A function images -> [(B, n) numpy per layer] through forward hooks."""
    captured = []
    modules = [model.bn1] + [getattr(model, f"layer{s}")[b] for s in range(1, 5) for b in range(2)] + [model.linear]
    for module in modules:
        module.register_forward_hook(
            lambda _m, _i, out: captured.append((out.mean(dim=(2, 3)) if out.ndim == 4 else out).cpu().numpy()))

    def neurons(x):
        captured.clear()
        with torch.no_grad():
            model(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).to(device))
        return list(captured)

    return neurons


def peer_coverage(neurons, batches):
    low = high = None
    for x in batches:
        acts = neurons(x)
        low = [a.min(0) for a in acts] if low is None else [np.minimum(l, a.min(0)) for l, a in zip(low, acts)]
        high = [a.max(0) for a in acts] if high is None else [np.maximum(h, a.max(0)) for h, a in zip(high, acts)]
    hits = [np.zeros((l.size, KMNC_K), bool) for l in low]
    upper = [np.zeros(l.size, bool) for l in low]
    lower = [np.zeros(l.size, bool) for l in low]
    top = [np.zeros(l.size, bool) for l in low]
    for x in batches:
        for i, a in enumerate(neurons(x)):
            width = (high[i] - low[i]) / KMNC_K
            inside = (a >= low[i]) & (a <= high[i])
            section = np.clip(np.floor((a - low[i]) / np.where(width == 0, 1, width)), 0, KMNC_K - 1).astype(int)
            rows, cols = np.nonzero(inside)
            hits[i][cols, section[rows, cols]] = True
            hits[i][(width == 0) & inside.any(0)] = True
            upper[i] |= (a > high[i]).any(0)
            lower[i] |= (a < low[i]).any(0)
            top[i][np.argsort(-a, axis=1, kind="stable")[:, :TKNC_K]] = True
    neurons_total = sum(l.size for l in low)
    up = sum(u.sum() for u in upper)
    return np.array([sum(h.sum() for h in hits) / (KMNC_K * neurons_total), (up + sum(l.sum() for l in lower)) / (2 * neurons_total),
                     up / neurons_total, sum(t.sum() for t in top) / neurons_total])


def peer_ebd(model, x, y, directions, magnitudes, device, direction_batch):
    """EBD as a PyTorch user writes it: each magnitude of the grid in turn, on the images
    not resolved yet (as robustjax's ``boundary_distances`` computes them)."""
    x = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).to(device)
    y = torch.from_numpy(np.array(y)).to(device)
    d = torch.from_numpy(np.ascontiguousarray(np.asarray(directions).transpose(0, 3, 1, 2))).to(device)
    distance = torch.full(y.shape, float(magnitudes[-1]), device=device)
    pending = torch.arange(len(y), device=device)
    with torch.no_grad():
        for m in magnitudes:
            images, labels = x[pending], y[pending]
            flipped = torch.zeros(len(pending), dtype=torch.bool, device=device)
            for start in range(0, d.shape[0], direction_batch):
                chunk = d[start:start + direction_batch]
                moved = (images[None] + float(m) * chunk[:, None]).clamp(0, 1).reshape(-1, *x.shape[1:])
                pred = model(moved).argmax(-1).reshape(chunk.shape[0], -1)
                flipped |= (pred != labels[None]).any(0)
            distance[pending[flipped]] = float(m)
            pending = pending[~flipped]
            if len(pending) == 0:
                break
    return distance.cpu().numpy()


# --------------------------------------------------------------------------- main


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-examples", type=int, default=10_000, help="images for the coverage metrics")
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--ebd-examples", type=int, default=100, help="images for EBD")
    parser.add_argument("--directions", type=int, default=10, help="EBD random directions (the toolkit uses 1000)")
    parser.add_argument("--direction-batch", type=int, default=10, help="EBD directions per forward pass")
    parser.add_argument("--quick", action="store_true", help="smoke run: 16 images, batch 8, EBD on 2 images, 2 directions")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    if args.quick:
        args.num_examples, args.batch_size, args.ebd_examples, args.directions, args.direction_batch = 16, 8, 2, 2, 2
    if args.num_examples % args.batch_size:
        parser.error("--num-examples must be a multiple of --batch-size")
    return args


def main() -> None:
    args = parse_arguments()
    clf = rj.zoo.create("resnet18_cifar", pretrained=False)
    device = torch_device()
    model = resnet18_to_torch(clf).to(device)
    rng = np.random.default_rng(0)
    images = rng.random((args.num_examples, 32, 32, 3), dtype=np.float32)
    batches = [images[i:i + args.batch_size] for i in range(0, args.num_examples, args.batch_size)]
    rows = []

    # Coverage: the first run compiles; the second is timed.
    _, first = timed(lambda: robustjax_coverage(clf, batches))
    ours, ours_s = timed(lambda: robustjax_coverage(clf, batches))
    neurons = torch_neurons(model, device)
    theirs, theirs_s = timed(lambda: synchronized(peer_coverage(neurons, batches)))
    rows.append({"name": "coverage KMNC+NBC+SNAC+TKNC", "robustjax_images_per_s": args.num_examples / ours_s,
                     "peer_images_per_s": args.num_examples / theirs_s, "ratio": theirs_s / ours_s,
                     "robustjax_compile_s": max(first - ours_s, 0.0), "examples": args.num_examples,
                     "values": {"kmnc_nbc_snac_tknc": ours.tolist(), "peer": theirs.tolist()},
                     "max_abs_difference": float(np.max(np.abs(ours - theirs)))})

    # EBD over the toolkit's grid.
    x = images[:args.ebd_examples]
    y = np.asarray(jnp.argmax(clf(jnp.asarray(x)), -1), np.int32)  # labels = clean predictions: EBD_i > 0
    key = jax.random.key(0)
    options = {"key": key, "num_directions": args.directions, "direction_batch": args.direction_batch}
    _, first = timed(lambda: jax.block_until_ready(st.boundary_distances(clf, x, y, **options)))
    ours, ours_s = timed(lambda: np.asarray(st.boundary_distances(clf, x, y, **options)))
    directions = st.random_directions(key, args.directions, x.shape[1:])
    theirs, theirs_s = timed(lambda: synchronized(peer_ebd(model, x, y, directions, st.EBD_MAGNITUDES, device,
                                                           args.direction_batch)))
    rows.append({"name": f"EBD {args.directions} directions", "robustjax_images_per_s": len(x) / ours_s,
                     "peer_images_per_s": len(x) / theirs_s, "ratio": theirs_s / ours_s,
                     "robustjax_compile_s": max(first - ours_s, 0.0), "examples": len(x),
                     "values": {"ebd": float(ours.mean()), "peer": float(theirs.mean())},
                     "max_abs_difference": float(np.max(np.abs(ours - theirs)))})

    settings = dict(vars(args), out=str(args.out), layers=LAYERS, kmnc_k=KMNC_K, tknc_k=TKNC_K,
                    neuron="channel (spatial mean)", peer="PyTorch twin + NumPy", torch_device=device)
    report("metrics", rows, machine_facts(("torch", "numpy")), settings, args.out)


if __name__ == "__main__":
    main()
