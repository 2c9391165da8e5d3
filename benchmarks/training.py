"""A PGD adversarial-training step on the embedded digits CNN: robustjax against PyTorch with
torchattacks.

    python -m benchmarks.training [--batch-size 128] [--repeats 5]

Both sides run RobustART's PGD-AT step from the same weights: linf PGD, eps 16/255, 20
steps of eps/15, random start, the model attacked in eval mode, then one SGD step
(momentum 0.9, Nesterov, weight decay 1e-4, label smoothing 0.1) on the clean and the
adversarial half of a doubled batch. robustjax: ``training.step.make_step`` (the attack and
the update in one jitted program, EMA off). PyTorch: ``torchattacks.PGD`` inside a torch
training loop. Images/s counts the batch's clean images per step; the median of the
timed steps after the first (which includes robustjax's compilation, reported apart).
"""

from __future__ import annotations

import os

import jax
import numpy as np
import torch
import torchattacks

import robustjax as rj
from benchmarks.common import arguments, machine_facts, report, seconds_per_call
from benchmarks.torch_models import digits_cnn_to_torch, to_nchw
from robustjax import training
from robustjax.training.model import TrainModel
from robustjax.training.step import init_state, make_step

EPS = 16 / 255
STEPS = 20
LEARNING_RATE = 0.1


def main() -> None:
    args = arguments(__doc__.splitlines()[0], batch_size=128)
    clf = rj.zoo.create("digits_cnn", pretrained=False, key=jax.random.key(0))
    x, y = rj.data.digits("train").arrays(limit=args.batch_size)
    recipe = training.Recipe(steps=1000, batch_size=len(y), learning_rate=LEARNING_RATE, warmup_from=LEARNING_RATE,
                             warmup_epochs=0, ema_decay=None)
    model = TrainModel.from_classifier(clf)
    _, step = make_step(model, recipe, training.techniques.create("pgd_at"), len(y))
    state = {"s": init_state(model, recipe.make_optimizer(len(y)), recipe)}
    seed_key = jax.random.key(0)

    def ours():
        state["s"], metrics = step(state["s"], x, y, seed_key)
        metrics["loss"].block_until_ready()

    twin = digits_cnn_to_torch(clf)
    optimizer = torch.optim.SGD(twin.parameters(), lr=LEARNING_RATE, momentum=0.9, nesterov=True, weight_decay=1e-4)
    attack = torchattacks.PGD(twin, eps=EPS, alpha=EPS / 15, steps=STEPS, random_start=True)
    x_torch, y_torch = to_nchw(x), torch.from_numpy(y).long()
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

    def theirs():
        twin.eval()  # RobustART makes the examples with the model in eval mode
        x_adv = attack(x_torch, y_torch)
        twin.train()
        optimizer.zero_grad()
        loss = loss_fn(twin(torch.cat([x_torch, x_adv])), torch.cat([y_torch, y_torch]))
        loss.backward()
        optimizer.step()

    load_before = os.getloadavg()[0]
    first, ours_s = seconds_per_call(ours, args.repeats)
    _, theirs_s = seconds_per_call(theirs, args.repeats)
    rows = [{
        "name": "pgd_at_step_digits_cnn",
        "params": {"eps": EPS, "steps": STEPS, "step_size": EPS / 15, "random_start": True,
                   "loss": "clean + adversarial halves, label smoothing 0.1", "optimizer": "sgd nesterov 0.9"},
        "robustjax_images_per_s": len(y) / ours_s,
        "peer_images_per_s": len(y) / theirs_s,
        "ratio": theirs_s / ours_s,
        "robustjax_compile_s": max(first - ours_s, 0.0),
        "final_loss_finite": bool(np.isfinite(float(step(state["s"], x, y, seed_key)[1]["loss"]))),
    }]
    settings = {"model": "digits_cnn", "batch_size": len(y), "repeats": args.repeats,
                "peer": "torchattacks inside a torch training loop", "torch_threads": torch.get_num_threads(),
                "devices": len(jax.local_devices()),
                # other processes on the machine skew both sides; the 1-minute load average says how busy it was
                "load_average_1min_before_after": [load_before, os.getloadavg()[0]]}
    report("training_pgd_at_digits", rows, machine_facts(("torch", "torchattacks")), settings, args.out)


if __name__ == "__main__":
    main()
