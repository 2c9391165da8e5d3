"""Certified robustness on the digits CNN: randomized smoothing against ART, CROWN and IBP
against auto_LiRPA where it installs.

    python -m benchmarks.certify [--smooth-examples 32] [--crown-examples 8] [--quick] [--out DIR]

The trained ``digits_cnn`` of the zoo and its PyTorch twin with the same weights
(``benchmarks/torch_models.py``), the first test digits, float32 on both sides, torch with
``--threads`` threads (default: the machine's cores, which JAX's CPU backend uses).

**Randomized smoothing** (Cohen et al., 2019): CERTIFY with n0 = 100 selection draws, n =
10,000 estimation draws, sigma = 0.25, alpha = 0.001, on ``--smooth-examples`` images.
robustjax's ``certify.certify`` against ART's ``PyTorchRandomizedSmoothing(sample_size=n0,
scale=sigma, alpha=alpha).certify(x, n, batch_size)`` on the twin. Both count the base
classifier's argmax over Gaussian draws added to the [0, 1] image without clipping, take
the class of the n0 draws and the one-sided Clopper-Pearson bound at level alpha on its
count among the n draws (ART's ``proportion_confint(alpha=2 * alpha, method="beta")``,
statsmodels', is the same bound) and abstain below 1/2. What differs: ART certifies one
image at a time and draws its noise with NumPy's global generator (float64, then float32)
for all n draws of an image at once, then classifies them ``batch_size`` at a time;
robustjax draws with ``jax.random`` in passes of ``draws_per_pass`` draws of every image
(64, its default) and classifies a pass of all images at once. ART's forward batch is set
to the same size, ``draws_per_pass`` x images (capped at n): the same images per forward
pass; a second peer row runs ART at its own default ``batch_size=32`` on a few images.
The draws differ, so the two agree statistically: the row gives the share of images where
both abstain or both return the same class and the mean |radius difference|. ART's certify
imports statsmodels (not a dependency of ART's wheel); without it the peer is recorded as
unavailable, with the reason.

**CROWN and IBP** (``certify.verified``) at eps = 2/255 (Linf, within [0, 1]) on
``--crown-examples`` images (CROWN, ``--crown-chunk`` images a call: a pass holds
``rows_per_pass`` x chunk rows) and ``--ibp-examples`` (IBP, one call): images/s, verified
accuracy, compile seconds; CROWN at each ``rows_per_pass`` of ``--rows-per-pass`` (the row
keeps the fastest, the sweep in the row). The peer is auto_LiRPA's
``BoundedModule(twin).compute_bounds(C=margins, method="CROWN" / "IBP")``, the same margin
specifications ``z_y - z_j``: when ``import auto_LiRPA`` fails (its PyPI release 0.3 needs
torch < 1.13 and numpy < 2) the row records the peer as unavailable with the reason.

robustjax is timed warm, after one call that compiles (its excess over the warm call is
the compile time); the peers are timed once. Results: results/certify.BACKEND.json.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import jax
import numpy as np
import torch

import robustjax as rj
from benchmarks.common import RESULTS, machine_facts, timed, write_json
from benchmarks.torch_models import digits_cnn_to_torch, to_nchw
from robustjax import certify

PEERS = ("torch", "adversarial-robustness-toolbox", "statsmodels", "auto_LiRPA")
CERTIFIED_RADII = (0.0, 0.25, 0.5)


# --------------------------------------------------------------------------- smoothing


def art_smoother(model: torch.nn.Module, num_classes: int, n0: int, sigma: float, alpha: float):
    """ART's randomized-smoothing estimator around the twin, or the reason it cannot run."""
    try:
        import statsmodels.stats.proportion  # noqa: F401  (ART's certify imports it on its first image)
        from art.estimators.certification.randomized_smoothing import PyTorchRandomizedSmoothing
    except ImportError as error:
        return None, f"ART's certify cannot run: {error} (its Clopper-Pearson bound is statsmodels' proportion_confint)"
    smoother = PyTorchRandomizedSmoothing(model=model, loss=torch.nn.CrossEntropyLoss(), input_shape=(1, 8, 8),
                                          nb_classes=num_classes, channels_first=True, device_type="cpu",
                                          sample_size=n0, scale=sigma, alpha=alpha)
    return smoother, None


def certified_accuracy(prediction: np.ndarray, radius: np.ndarray, y: np.ndarray) -> list[float]:
    """Per radius of ``CERTIFIED_RADII``: the share of images classified correctly with at
    least that certified radius (for ART's outputs; robustjax's is ``certify.certified_accuracy``)."""
    return [float(np.mean((prediction == y) & (radius >= r))) for r in CERTIFIED_RADII]


def smoothing_rows(clf, model, x, y, args) -> list[dict]:
    key = jax.random.key(0)

    def ours():
        return certify.certify(clf, x, sigma=args.sigma, key=key, n0=args.n0, n=args.n, alpha=args.alpha,
                               draws_per_pass=args.draws_per_pass)

    first, warm, mine = timed(ours, args.repeats)
    row = {"name": f"smoothing_certify_n{args.n}", "examples": len(x), "n0": args.n0, "n": args.n,
           "sigma": args.sigma, "alpha": args.alpha, "draws_per_pass": args.draws_per_pass,
           "robustjax_images_per_s": len(x) / warm, "robustjax_compile_s": max(first - warm, 0.0),
           "robustjax_seconds": warm,
           "robustjax": {"abstained": float(np.mean(mine.prediction == certify.smoothing.ABSTAIN)),
                         "mean_radius": float(mine.radius.mean()),
                         "certified_accuracy": dict(zip(map(str, CERTIFIED_RADII),
                                                        certify.certified_accuracy(mine, y, CERTIFIED_RADII).tolist()))}}
    smoother, reason = art_smoother(model, clf.num_classes, args.n0, args.sigma, args.alpha)
    rows = [row]
    if smoother is None:
        row |= {"peer": "ART PyTorchRandomizedSmoothing", "peer_available": False, "peer_reason": reason}
        return rows
    images = to_nchw(x).numpy()
    batch = min(args.n, args.draws_per_pass * len(x)) if args.art_batch is None else args.art_batch
    np.random.seed(0)  # ART draws from NumPy's global generator
    start = time.perf_counter()
    prediction, radius = smoother.certify(images, n=args.n, batch_size=batch)
    peer_s = time.perf_counter() - start
    row |= {"peer": f"ART PyTorchRandomizedSmoothing (batch_size={batch})", "peer_available": True,
            "peer_batch_size": batch, "peer_images_per_s": len(x) / peer_s, "ratio": peer_s / warm,
            "peer_result": {"abstained": float(np.mean(prediction == -1)), "mean_radius": float(radius.mean()),
                            "certified_accuracy": dict(zip(map(str, CERTIFIED_RADII),
                                                           certified_accuracy(prediction, radius, y)))},
            "agreement": float(np.mean(prediction == mine.prediction)),
            "mean_abs_radius_difference": float(np.mean(np.abs(radius - mine.radius))),
            "max_abs_radius_difference": float(np.max(np.abs(radius - mine.radius)))}
    if args.art_default_examples:  # ART's own default forward batch, 32 draws, on a few images
        count = min(args.art_default_examples, len(x))
        start = time.perf_counter()
        prediction, radius = smoother.certify(images[:count], n=args.n)
        seconds = time.perf_counter() - start
        rows.append({"name": f"smoothing_certify_n{args.n}_art_default_batch", "examples": count,
                     "peer": "ART PyTorchRandomizedSmoothing (its default batch_size=32)", "peer_available": True,
                     "peer_batch_size": 32, "peer_images_per_s": count / seconds,
                     "robustjax_images_per_s": row["robustjax_images_per_s"],
                     "robustjax_compile_s": row["robustjax_compile_s"],
                     "ratio": row["robustjax_images_per_s"] / (count / seconds),
                     "agreement": float(np.mean(prediction == mine.prediction[:count])),
                     "mean_abs_radius_difference": float(np.mean(np.abs(radius - mine.radius[:count])))})
    return rows


# --------------------------------------------------------------------------- CROWN and IBP


def lirpa_peer():
    """auto_LiRPA's classes, or the reason they cannot be imported."""
    try:
        from auto_LiRPA import BoundedModule, BoundedTensor
        from auto_LiRPA.perturbations import PerturbationLpNorm
    except Exception as error:  # noqa: BLE001  (an old release fails on import with torch 2 / numpy 2)
        return None, (f"import auto_LiRPA failed: {type(error).__name__}: {error}; its PyPI release (0.3) needs "
                      "torch < 1.13 and numpy < 2, this environment has torch "
                      f"{torch.__version__} and numpy {np.__version__}")
    return (BoundedModule, BoundedTensor, PerturbationLpNorm), None


def margin_specs(y: np.ndarray, num_classes: int) -> np.ndarray:
    """(B, K - 1, K): the rows e_y - e_j for every class j != y, in increasing j."""
    eye = np.eye(num_classes, dtype=np.float32)
    return np.stack([eye[label] - np.delete(eye, label, axis=0) for label in y])


def without_label(margins: np.ndarray, y: np.ndarray) -> np.ndarray:
    """robustjax's (B, K) margin lower bounds (0 at j = y) as (B, K - 1), in increasing j."""
    return np.stack([np.delete(row, label) for row, label in zip(margins, y)])


def lirpa_margins(peer, model, x: np.ndarray, y: np.ndarray, eps: float, method: str) -> tuple[np.ndarray, float]:
    """auto_LiRPA's lower bounds of the margins over the eps box within [0, 1], and the
    seconds its ``compute_bounds`` took (the bounded module is built beforehand)."""
    bounded_module, bounded_tensor, perturbation = peer
    images = to_nchw(x)
    bounded = bounded_module(model, torch.empty_like(images), device="cpu")
    box = perturbation(norm=np.inf, eps=eps, x_L=torch.clamp(images - eps, 0, 1), x_U=torch.clamp(images + eps, 0, 1))
    specs = torch.from_numpy(margin_specs(y, 10))
    start = time.perf_counter()
    lower, _ = bounded.compute_bounds(x=(bounded_tensor(images, box),), C=specs, method=method, bound_upper=False)
    return lower.detach().numpy(), time.perf_counter() - start


def bound_rows(clf, model, x, y, args) -> list[dict]:
    peer, reason = lirpa_peer()
    rows = []
    for method, count in (("ibp", args.ibp_examples), ("crown", args.crown_examples)):
        images, labels = x[:count], y[:count]
        sweep = {}
        for rows_per_pass in (args.rows_per_pass if method == "crown" else [256]):
            def ours(rows_per_pass=rows_per_pass):  # CROWN: --crown-chunk images a call, to bound the memory
                chunk = args.crown_chunk if method == "crown" else count
                return np.concatenate([np.asarray(certify.verified(
                    clf, images[i:i + chunk], labels[i:i + chunk], args.eps, method=method,
                    rows_per_pass=rows_per_pass)) for i in range(0, count, chunk)])

            first, warm, verified = timed(ours, args.repeats)
            sweep[rows_per_pass] = {"images_per_s": count / warm, "compile_s": max(first - warm, 0.0),
                                    "seconds": warm, "verified_accuracy": float(verified.mean())}
            print(f"{method} rows_per_pass={rows_per_pass}: {count / warm:.2f} img/s, compile "
                  f"{sweep[rows_per_pass]['compile_s']:.1f} s", flush=True)
        fastest = max(sweep, key=lambda r: sweep[r]["images_per_s"])
        best = sweep[fastest]
        clean = np.argmax(np.asarray(clf(images)), axis=-1) == labels
        row = {"name": f"{method}_eps{args.eps * 255:g}_255", "method": method, "eps": args.eps, "examples": count,
               "robustjax_images_per_s": best["images_per_s"], "robustjax_compile_s": best["compile_s"],
               "robustjax_seconds": best["seconds"], "verified_accuracy": best["verified_accuracy"],
               "clean_accuracy": float(clean.mean()), "peer": "auto_LiRPA BoundedModule.compute_bounds"}
        if method == "crown":
            row |= {"rows_per_pass": fastest, "rows_per_pass_sweep": {str(r): s for r, s in sweep.items()}}
        if peer is None:
            row |= {"peer_available": False, "peer_reason": reason}
        else:
            theirs, seconds = lirpa_margins(peer, model, images, labels, args.eps, method.upper())
            chunk = args.crown_chunk if method == "crown" else count
            ours_bounds = without_label(np.concatenate([np.asarray(certify.margin_lower_bounds(
                clf, images[i:i + chunk], labels[i:i + chunk], args.eps, method=method, rows_per_pass=fastest))
                for i in range(0, count, chunk)]), labels)
            row |= {"peer_available": True, "peer_images_per_s": count / seconds, "ratio": seconds / best["seconds"],
                    "peer_verified_accuracy": float(np.mean(np.all(theirs > 0, axis=1))),
                    "max_abs_bound_difference": float(np.max(np.abs(theirs - ours_bounds)))}
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- main


def write_results(name: str, rows: list[dict], facts: dict, settings: dict, out: Path) -> Path:
    """Prints the rows and writes them as ``benchmarks.common.report`` does; a row whose peer
    could not run has no peer rate or ratio, and says why."""
    print(f"{'benchmark':36s} {'robustjax img/s':>16s} {'peer img/s':>11s} {'ratio':>6s} {'compile s':>10s}")
    for row in rows:
        peer = f"{row['peer_images_per_s']:11.2f} {row['ratio']:6.2f}" if "ratio" in row else f"{'n/a':>11s} {'-':>6s}"
        print(f"{row['name']:36s} {row['robustjax_images_per_s']:16.2f} {peer} {row['robustjax_compile_s']:10.2f}")
        if not row.get("peer_available", True):
            print(f"    peer unavailable: {row['peer_reason']}")
    return write_json(name, rows, facts, settings, out)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smooth-examples", type=int, default=32, help="images certified by smoothing")
    parser.add_argument("--n0", type=int, default=100, help="selection draws")
    parser.add_argument("--n", type=int, default=10_000, help="estimation draws")
    parser.add_argument("--sigma", type=float, default=0.25)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--draws-per-pass", type=int, default=64, help="robustjax's draws per image per pass")
    parser.add_argument("--art-batch", type=int, default=None,
                        help="ART's batch_size (default: draws-per-pass x images, the same forward batch)")
    parser.add_argument("--art-default-examples", type=int, default=2,
                        help="images ART also certifies at its default batch_size=32 (0: skip)")
    parser.add_argument("--eps", type=float, default=2 / 255, help="Linf radius of CROWN and IBP")
    parser.add_argument("--crown-examples", type=int, default=8)
    parser.add_argument("--crown-chunk", type=int, default=4,
                        help="images per CROWN call: a pass holds rows_per_pass x chunk rows (memory)")
    parser.add_argument("--ibp-examples", type=int, default=256)
    parser.add_argument("--rows-per-pass", type=lambda s: [int(v) for v in s.split(",")], default=[256, 1024, 4096],
                        help="CROWN's rows_per_pass values to try (comma-separated)")
    parser.add_argument("--repeats", type=int, default=1, help="warm robustjax calls timed (median)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 4 images, n0=20, n=500; CROWN on 1 image at rows_per_pass 256; torch on 1 thread")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads (default: the machine's cores, %(default)s)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    if args.quick:
        args.smooth_examples, args.n0, args.n, args.art_default_examples = 4, 20, 500, 1
        args.crown_examples, args.ibp_examples, args.rows_per_pass, args.repeats = 1, 16, [256], 1
        args.threads = 1  # a smoke run beside other jobs: torch's spinning threads would only slow it
    return args


def main() -> None:
    args = parse_arguments()
    torch.set_num_threads(args.threads)
    clf = rj.zoo.create("digits_cnn")
    model = digits_cnn_to_torch(clf)
    x, y = rj.data.digits("test").arrays(limit=max(args.smooth_examples, args.crown_examples, args.ibp_examples))
    load_before = os.getloadavg()[0]
    rows = smoothing_rows(clf, model, x[:args.smooth_examples], y[:args.smooth_examples], args)
    rows += bound_rows(clf, model, x, y, args)
    settings = dict(vars(args), out=str(args.out), model="digits_cnn (trained, zoo)", torch_threads=args.threads,
                    certified_radii=CERTIFIED_RADII,
                    load_average_1min_before_after=[load_before, os.getloadavg()[0]])
    write_results("certify", rows, machine_facts(PEERS), settings, args.out)


if __name__ == "__main__":
    main()
