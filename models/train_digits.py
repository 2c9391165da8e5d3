"""Trains an embedded digits model from scratch, reproducibly, and writes its weights and card.

    python models/train_digits.py NAME      # NAME: digits_cnn or digits_mlp

Adam (lr 1e-3, optax) on the 1,297 training digits, batch 64, 40 epochs, fixed seeds;
on a 2-core CPU it takes well under a minute. The card records the test accuracy.
Writes models/NAME/weights and models/NAME/card.json (or under --out).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import robustjax as rj
from robustjax.zoo.weights import save_weights

NAMES = ("digits_cnn", "digits_mlp")
SEED = 0
EPOCHS = 40
BATCH_SIZE = 64
LEARNING_RATE = 1e-3
HERE = Path(__file__).resolve().parent


def train(name: str) -> rj.Classifier:
    x_train, y_train = rj.data.digits("train").arrays()
    clf = rj.zoo.create(name, pretrained=False, key=jax.random.key(SEED))
    optimizer = optax.adam(LEARNING_RATE)
    opt_state = optimizer.init(clf.params)

    @jax.jit
    def step(clf, opt_state, x, y):
        def loss_fn(params):
            logits = clf.replace(params=params)(x)
            return optax.losses.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        grads = jax.grad(loss_fn)(clf.params)
        updates, opt_state = optimizer.update(grads, opt_state, clf.params)
        return clf.replace(params=optax.apply_updates(clf.params, updates)), opt_state

    rng = np.random.default_rng(SEED)
    for _ in range(EPOCHS):
        order = rng.permutation(len(y_train))
        for start in range(0, len(order), BATCH_SIZE):
            batch = order[start : start + BATCH_SIZE]
            clf, opt_state = step(clf, opt_state, x_train[batch], y_train[batch])
    return clf


def model_card(name: str, clf: rj.Classifier, accuracy: float) -> dict:
    architecture = type(nnx.merge(clf.apply_fn.graphdef, clf.params))
    return {
        "name": name,
        "family": rj.zoo.get(name).family,
        "description": architecture.__doc__,
        "num_params": rj.zoo.count_params(clf),
        "flops": rj.zoo.count_flops(clf),
        "input_shape": list(clf.input_shape),
        "num_classes": clf.num_classes,
        "normalization": {"mean": list(clf.mean), "std": list(clf.std)},
        "weights": {
            "source": f"trained from scratch by models/train_digits.py {name}",
            "format": "orbax-checkpoint, nnx.to_pure_dict layout",
            "training": {
                "dataset": "digits/train (1,297 images)",
                "optimizer": f"optax.adam({LEARNING_RATE})",
                "epochs": EPOCHS,
                "batch_size": BATCH_SIZE,
                "seed": SEED,
            },
        },
        "metrics": {"digits/test clean accuracy": round(accuracy, 4)},
        "versions": {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=NAMES)
    parser.add_argument("--out", type=Path, help="folder to write to (default models/NAME)")
    args = parser.parse_args()
    out = args.out or HERE / args.name
    clf = train(args.name)
    x_test, y_test = rj.data.digits("test").arrays()
    accuracy = float(jnp.mean(jnp.argmax(clf(x_test), -1) == y_test))
    out.mkdir(parents=True, exist_ok=True)
    save_weights(out / "weights", clf.params)
    card = model_card(args.name, clf, accuracy)
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"{args.name}: test accuracy {accuracy:.4f}; weights and card written to {out}")


if __name__ == "__main__":
    main()
