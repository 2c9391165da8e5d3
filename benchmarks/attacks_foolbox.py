"""Attack throughput, robustjax against Foolbox 3 on the same JAX model (the digits CNN).

    python -m benchmarks.attacks_foolbox [--batch-size N] [--repeats N] [--out DIR]

Foolbox's JAX backend (through EagerPy) calls the model and its gradient op by op, eagerly;
robustjax compiles each attack into one program. Both attack the same trained classifier,
on the same images, with the same budgets as ``benchmarks.attacks``' rows: PGD-20 (Linf and
L2, random start, step 2.5 eps / 20, every step) and CW-L2 (5 binary-search steps of 100
Adam steps, c from 0.01). Each library's success rate is recorded as it reports it and as
re-checked here: the returned point is classified wrong, lies in [0, 1] and, for PGD,
within the epsilon ball (Foolbox's CW returns its starting point, the clean image clipped
or an all-zero image, for examples it failed on, and counts them as failures itself).
One JSON file: results/attacks_foolbox_digits.BACKEND.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import eagerpy as ep
import foolbox
import jax
import jax.numpy as jnp
import numpy as np

import robustjax as rj
from benchmarks.attacks import STEPS, digits_setup
from benchmarks.common import RESULTS, machine_facts, report, timed

ATTACKS = {  # name: (norm, robustjax attack at eps, Foolbox attack at eps)
    "pgd20_linf": ("linf", lambda eps: rj.attacks.PGD(eps=eps, norm="linf", steps=STEPS, early_stop=False),
                   lambda eps: foolbox.attacks.LinfPGD(abs_stepsize=2.5 * eps / STEPS, steps=STEPS)),
    "pgd20_l2": ("l2", lambda eps: rj.attacks.PGD(eps=eps, norm="l2", steps=STEPS, early_stop=False),
                 lambda eps: foolbox.attacks.L2PGD(abs_stepsize=2.5 * eps / STEPS, steps=STEPS)),
    "cw_l2_100x5": (None, lambda eps: rj.attacks.CWL2(binary_search_steps=5, steps=100, abort_early=False),
                    lambda eps: foolbox.attacks.L2CarliniWagnerAttack(binary_search_steps=5, steps=100,
                                                                      initial_const=0.01, abort_early=False)),
}


def rechecked(clf: rj.Classifier, x, y, x_adv, norm: str | None, eps: float) -> float:
    """Share of examples whose returned point is misclassified, in [0, 1] and (with a norm)
    within ``eps`` of the clean image (1e-5 of float slack)."""
    x, x_adv = np.asarray(x), np.asarray(x_adv)
    fooled = np.asarray(clf(x_adv)).argmax(-1) != y
    in_box = ((x_adv >= 0) & (x_adv <= 1)).reshape(len(y), -1).all(axis=1)
    if norm is not None:
        distance = rj.attacks.threat.per_example_norm(jnp.asarray(x_adv - x), norm)
        in_box &= np.asarray(distance) <= eps + 1e-5
    return float((fooled & in_box).mean())


def measure(name: str, clf: rj.Classifier, x, y, eps: dict[str, float], repeats: int) -> dict:
    norm, ours, theirs = ATTACKS[name]
    epsilon = eps[norm] if norm else None
    model = foolbox.JAXModel(lambda images: clf(images), bounds=(0, 1))
    x_jax, y_jax = jnp.asarray(x), jnp.asarray(y)
    attack = ours(epsilon)
    first, ours_s, result = timed(lambda: jax.block_until_ready(attack(clf, x_jax, y_jax, key=jax.random.key(0))),
                                  repeats)

    def foolbox_call():
        _, clipped, success = theirs(epsilon)(model, x_jax, y_jax, epsilons=epsilon)
        return jax.block_until_ready(ep.astensor(clipped).raw), np.asarray(ep.astensor(success).raw)

    _, theirs_s, (theirs_adv, theirs_success) = timed(foolbox_call, repeats)
    batch = len(y)
    return {
        "name": name,
        "params": attack.params(),
        "robustjax_images_per_s": batch / ours_s,
        "peer_images_per_s": batch / theirs_s,
        "ratio": theirs_s / ours_s,
        "robustjax_compile_s": max(first - ours_s, 0.0),
        "robustjax_success_rate": float(np.mean(result.success)),
        "robustjax_success_rate_rechecked": rechecked(clf, x, y, result.x_adv, norm, epsilon),
        "peer_success_rate": float(theirs_success.mean()),
        "peer_success_rate_rechecked": rechecked(clf, x, y, theirs_adv, norm, epsilon),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2, help="timed calls after the first (median taken)")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated rows")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    if unknown := sorted(set(args.attacks.split(",")) - set(ATTACKS)):
        parser.error(f"unknown attacks {unknown}; known: {sorted(ATTACKS)}")
    setup = digits_setup(args.batch_size)
    rows = [measure(name, setup.clf, setup.x, setup.y, setup.eps, args.repeats) for name in args.attacks.split(",")]
    settings = {"model": setup.clf.name, "batch_size": len(setup.y), "repeats": args.repeats, "eps": setup.eps,
                "peer": "foolbox (JAX backend, eager)"}
    report("attacks_foolbox_digits", rows, machine_facts(("foolbox", "eagerpy")), settings, args.out)


if __name__ == "__main__":
    main()
