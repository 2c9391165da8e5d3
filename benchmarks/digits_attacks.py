"""FGSM and PGD-10 on the embedded digits CNN: robustjax against torchattacks.

    python -m benchmarks.digits_attacks [--batch-size 256] [--repeats 5]

Both libraries attack the same images with the same weights and settings (PGD: linf,
eps 0.1, step 0.025, random start, no early stop). robustjax's first call includes
compilation, reported separately; throughput is the median of the later calls.
"""

from __future__ import annotations

import jax
import numpy as np
import torch
import torchattacks

import robustjax as rj
from benchmarks.common import arguments, machine_facts, report, seconds_per_call
from benchmarks.torch_models import digits_cnn_to_torch, to_nchw

EPS = 0.1
PGD_STEPS = 10


def main() -> None:
    args = arguments(__doc__.splitlines()[0], batch_size=256)
    clf = rj.zoo.create("digits_cnn")
    twin = digits_cnn_to_torch(clf)
    x, y = rj.data.digits("all").arrays(limit=args.batch_size)
    x_torch, y_torch = to_nchw(x), torch.from_numpy(y).long()
    step = 2.5 * EPS / PGD_STEPS
    pairs = {
        "fgsm": (rj.attacks.FGSM(eps=EPS), torchattacks.FGSM(twin, eps=EPS)),
        f"pgd{PGD_STEPS}_linf": (
            rj.attacks.PGD(eps=EPS, steps=PGD_STEPS, step_size=step, early_stop=False),
            torchattacks.PGD(twin, eps=EPS, alpha=step, steps=PGD_STEPS, random_start=True),
        ),
    }
    rows = []
    key = jax.random.key(0)
    for name, (ours, theirs) in pairs.items():
        first, ours_s = seconds_per_call(lambda: ours(clf, x, y, key=key).x_adv.block_until_ready(), args.repeats)
        _, theirs_s = seconds_per_call(lambda: theirs(x_torch, y_torch), args.repeats)
        ours_success = float(ours(clf, x, y, key=key).success.mean())
        theirs_success = float(np.mean(twin(theirs(x_torch, y_torch)).argmax(1).numpy() != y))
        rows.append({
            "name": name,
            "params": ours.params(),
            "robustjax_images_per_s": len(y) / ours_s,
            "peer_images_per_s": len(y) / theirs_s,
            "ratio": theirs_s / ours_s,
            "robustjax_compile_s": max(first - ours_s, 0.0),
            "robustjax_success_rate": ours_success,
            "peer_success_rate": theirs_success,
        })
    settings = {"model": "digits_cnn", "batch_size": len(y), "repeats": args.repeats,
                "peer": "torchattacks", "torch_threads": torch.get_num_threads()}
    report("digits_attacks", rows, machine_facts(("torch", "torchattacks")), settings, args.out)


if __name__ == "__main__":
    main()
