"""Trains an embedded digits supernet from scratch, reproducibly, and writes its weights and card.

    python models/train_nas.py SPACE      # SPACE: nb201_digits or bignas_resnet_basic_digits

Runs ``robustjax.nas.train_supernet`` (the sandwich rule with in-place distillation for
BigNAS, uniform single-path sampling for NAS-Bench-201) on the 1,297 training digits with
the settings pinned below, then records in the card the test accuracy of named subnets and
of 16 seeded random ones, each sliced from the supernet and recalibrated on the training
digits. On a 2-core CPU each space takes a few minutes. Writes models/nas_SPACE/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import flax
import jax
import numpy as np
import optax

import robustjax as rj

SETTINGS = {
    "nb201_digits": rj.nas.TrainSettings(steps=4000, batch_size=64, learning_rate=2e-3, seed=0),
    "bignas_resnet_basic_digits": rj.nas.TrainSettings(steps=1500, batch_size=64, learning_rate=2e-3, seed=0),
}
HERE = Path(__file__).resolve().parent


def accuracies(supernet: rj.nas.Supernet, configs: dict, calibration: np.ndarray) -> dict[str, float]:
    x_test, y_test = rj.data.digits("test").arrays()
    out = {}
    for label, config in configs.items():
        clf = supernet.subnet(config, calibration=calibration)
        out[label] = round(float(np.mean(np.asarray(clf(x_test)).argmax(-1) == y_test)), 4)
    return out


def evaluated_subnets(space) -> dict:
    if isinstance(space, rj.nas.BigNASSpace):
        named = {"largest": space.largest(), "smallest": space.smallest()}
    else:
        named = {f"{i} ({label})": space.config(i) for i, label in ((11472, "ResNet cell"), (0, "id 0"))}
    drawn = space.sample(jax.random.key(1), 16)
    return {**named, **{f"random {c.arch_id}": c for c in drawn}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space", choices=sorted(SETTINGS))
    parser.add_argument("--out", type=Path, help="folder to write to (default models/nas_SPACE)")
    args = parser.parse_args()
    out = args.out or HERE / f"nas_{args.space}"
    space, settings = rj.nas.space(args.space), SETTINGS[args.space]
    x_train, y_train = rj.data.digits("train").arrays()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        supernet = rj.nas.train_supernet(space, x_train, y_train, work, settings,
                                         log=lambda step, loss: print(f"step {step}: loss {loss:.4f}", flush=True))
    seconds = time.perf_counter() - started
    scores = accuracies(supernet, evaluated_subnets(space), x_train)
    random_scores = [v for k, v in scores.items() if k.startswith("random")]
    shutil.rmtree(out / "weights", ignore_errors=True)
    supernet.save(out)
    card = {
        "name": f"nas.{args.space}",
        "description": f"weight-sharing supernet of the {args.space} search space, trained on the embedded digits",
        "space": args.space,
        "weights": {
            "source": f"trained from scratch by models/train_nas.py {args.space}",
            "format": "orbax-checkpoint, nnx.to_pure_dict layout; supernet.json names the space",
            "training": {"dataset": "digits/train (1,297 images)", "optimizer": "optax.adam, cosine decay",
                         "rule": "sandwich + in-place distillation" if isinstance(space, rj.nas.BigNASSpace)
                         else "uniform single-path", **settings.__dict__, "seconds_on_2_core_cpu": round(seconds)},
        },
        "metrics": {"digits/test clean accuracy after BN recalibration on digits/train": scores,
                    "random subnets: mean, min": [round(float(np.mean(random_scores)), 4), min(random_scores)]},
        "versions": {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__},
    }
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(json.dumps(card["metrics"], indent=2))
    print(f"written to {out} in {seconds:.0f} s of training")


if __name__ == "__main__":
    main()
