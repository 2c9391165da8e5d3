"""Retrains the embedded default model, reproducibly, and rewrites its weights and card.

    python models/digits_cnn/train.py

Adam (lr 1e-3, optax) on the 1,297 training digits, batch 64, 40 epochs, fixed seeds;
on a 2-core CPU it takes well under a minute. The card records the test accuracy.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import robustjax as rj
from robustjax.zoo import digits_cnn as arch
from robustjax.zoo.weights import save_weights

SEED = 0
EPOCHS = 40
BATCH_SIZE = 64
LEARNING_RATE = 1e-3
HERE = Path(__file__).resolve().parent


def train() -> rj.Classifier:
    x_train, y_train = rj.data.digits("train").arrays()
    clf = rj.zoo.create(arch.NAME, pretrained=False, key=jax.random.key(SEED))
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


def main() -> None:
    clf = train()
    x_test, y_test = rj.data.digits("test").arrays()
    accuracy = float(jnp.mean(jnp.argmax(clf(x_test), -1) == y_test))
    module = arch.DigitsCNN(rngs=nnx.Rngs(0))
    nnx.update(module, clf.params)
    save_weights(HERE / "weights", nnx.state(module))
    card = {
        "name": arch.NAME,
        "family": "digits_cnn",
        "description": arch.DigitsCNN.__doc__,
        "num_params": rj.zoo.count_params(clf),
        "flops": rj.zoo.count_flops(clf),
        "input_shape": list(arch.INPUT_SHAPE),
        "num_classes": 10,
        "normalization": {"mean": list(arch.MEAN), "std": list(arch.STD)},
        "weights": {
            "source": "trained from scratch by models/digits_cnn/train.py",
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
        "versions": {"jax": jax.__version__, "flax": __import__("flax").__version__, "optax": optax.__version__},
    }
    (HERE / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"test accuracy {accuracy:.4f}; weights and card written to {HERE}")


if __name__ == "__main__":
    main()
