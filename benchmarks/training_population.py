"""NAS-Bench-201 digits cells adversarially trained as one population (issue 39), against
PyTorch + torchattacks training them one network at a time, as NAS-RobBench-201 does.

    python -m benchmarks.training_population [--networks 16] [--timed-steps 3] [--torch-networks 4]

NAS-RobBench-201's recipe scaled to the digits: PGD-7 adversarial training (linf eps 8/255,
7 steps of 2/255, random start; robustjax's ``madry`` technique, torchattacks.PGD with the model
in training mode as ``madry`` attacks it), the loss on the adversarial examples, SGD momentum
0.9, weight decay 5e-4, batch 256, 50 epochs of the digits train split. Both sides start from
the same weights (xautodl's ``TinyNetwork`` holding the init robustjax gives each cell).

Three layouts of the population: ``masks`` (the networks side by side under ``vmap``, every
edge computing every op and selecting its own), ``sequential`` (one network after another
under ``lax.map``, each edge switching to its op, so each cell computes its own ops only) and
``unrolled`` (each cell's own training step at its own shapes, written one after another into
one program; populations of ``sweep.trained_cells.UNROLLED_CELLS`` cells, as a sweep trains them).

Timed: training steps after the first (whose compilation, robustjax's, is reported apart).
Networks per hour = 3600 / (the run's steps x seconds per network-step): warm, and "cold"
with one compilation per population counted. Beside it, the FLOPs one population step
executes over the sum of each cell's own training step alone (XLA's cost analysis of the
lowered programs; sequential executes its own by construction, XLA's static count, which
counts a loop body once with every branch of a switch, is given beside it), and the GFLOP/s
achieved against the machine's matrix-product peak.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import robustjax as rj
from benchmarks.common import RESULTS, machine_facts, matmul_peak_gflops, report
from robustjax import training
from robustjax.data.dataset import batch_indices
from robustjax.nas.trainable import standalone_network, trainable
from robustjax.sweep.trained_cells import initial_network, populations
from robustjax.training.model import TrainModel
from robustjax.training.population import population_step, unrolled_step
from robustjax.training.step import init_state, make_step

EPS, STEP_SIZE, ATTACK_STEPS = 8 / 255, 2 / 255, 7
EPOCHS, BATCH_SIZE, LEARNING_RATE, WEIGHT_DECAY = 50, 256, 0.05, 5e-4
TECHNIQUES = training.techniques.create("madry")
LAYOUTS = {"sequential": "sequential", "masks": "vmap", "unrolled": "unrolled"}  # row name: train_population's


def recipe(num_examples: int, batch_size: int = BATCH_SIZE) -> training.Recipe:
    return training.Recipe(epochs=EPOCHS, batch_size=batch_size, learning_rate=LEARNING_RATE,
                           warmup_from=LEARNING_RATE, warmup_epochs=0, weight_decay=WEIGHT_DECAY, nesterov=False,
                           label_smoothing=0.0, ema_decay=None)


def networks_of(space, cells: list, layout: str) -> list:
    """Cell ``i`` initialised from key ``i``, in the form ``layout`` trains it."""
    return [initial_network(space, space.resolve(cell), jax.random.key(i), layout) for i, cell in enumerate(cells)]


def ours(space, cells: list, data, timed_steps: int, layout: str, batch_size: int = BATCH_SIZE,
         attack_steps: int = ATTACK_STEPS) -> dict:
    """Seconds of the populations' first step (compiling) and per later step, ``layout``
    being a row name (:data:`LAYOUTS`); the populations a sweep forms
    (``sweep.trained_cells.populations``) train one after another."""
    networks = networks_of(space, cells, LAYOUTS[layout])
    run = recipe(data.num_examples, batch_size)
    times = {"first": 0.0, "timed": 0.0}
    with tempfile.TemporaryDirectory() as folder:
        for group in populations(range(len(cells)), LAYOUTS[layout]):
            for name, steps in (("first", 1), ("timed", timed_steps)):
                started = time.perf_counter()
                training.train_population([networks[i] for i in group], data, Path(folder, f"{name}{group[0]}"), run,
                                          TECHNIQUES, seeds=list(group), attack_eps=EPS, attack_steps=attack_steps,
                                          checkpoint_every=10 ** 9, log_every=10 ** 9, stop_after=steps,
                                          layout=LAYOUTS[layout])
                times[name] += time.perf_counter() - started  # train_population returns host arrays: work is done
    return {"first_step_s": times["first"], "step_s": times["timed"] / timed_steps,
            "steps_per_run": run.total_steps(data.num_examples)}


def theirs(space, cells: list, data, timed_steps: int, threads: int, batch_size: int = BATCH_SIZE,
           attack_steps: int = ATTACK_STEPS) -> float:
    """Seconds per training step of one network in PyTorch + torchattacks, over ``cells``
    (on the GPU when JAX runs on one)."""
    import torch
    import torchattacks

    from benchmarks.common import synchronized, torch_device
    from benchmarks.torch_models import Normalized
    from benchmarks.torch_nb201 import tiny_network

    torch.set_num_threads(threads)
    device = torch_device()

    spent = 0.0
    for i, cell in enumerate(cells):
        weights = nnx.to_pure_dict(standalone_network(space, cell, trainable(space, cell, key=jax.random.key(i))).params)
        model = Normalized(tiny_network(space, space.resolve(cell), weights), space.mean, space.std).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9, weight_decay=WEIGHT_DECAY)
        attack = torchattacks.PGD(model, eps=EPS, alpha=STEP_SIZE, steps=attack_steps, random_start=True)
        attack.set_model_training_mode(model_training=True)
        for step in range(timed_steps + 1):
            started = time.perf_counter()
            x, y = data.take(batch_indices(data.num_examples, batch_size, i, step))
            images = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(device)
            labels = torch.from_numpy(y.astype(np.int64)).to(device)
            model.train()
            adversarial = attack(images, labels)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(adversarial), labels).backward()
            optimizer.step()
            synchronized(None)
            if step:  # the first step warms torch's allocator up
                spent += time.perf_counter() - started
    return spent / (len(cells) * timed_steps)


def step_flops(space, cells: list, data, layout: str, batch_size: int = BATCH_SIZE,
               attack_steps: int = ATTACK_STEPS) -> dict:
    """FLOPs of the population steps of ``layout`` (a row name; lowered programs, XLA's cost
    analysis) and the sum of each cell's own step at its own shapes."""
    run = recipe(data.num_examples, batch_size)
    x, y = data.take(batch_indices(data.num_examples, batch_size, 0, 0))

    def lowered_flops(classifiers: list, step_of) -> float:
        models = [TrainModel.from_classifier(c) for c in classifiers]
        made = [make_step(m, run, TECHNIQUES, data.num_examples, attack_eps=EPS, attack_steps=attack_steps)
                for m in models]
        states = [init_state(m, made[0][0], run) for m in models]
        return step_of([step for _, step in made], states).cost_analysis()["flops"]

    def population(steps, states):
        n = len(states)
        keys = jax.vmap(jax.random.key)(jnp.arange(n, dtype=jnp.uint32))
        if layout == "unrolled":
            return unrolled_step(tuple(steps)).lower(tuple(states), jnp.zeros(n, bool), np.stack([x] * n),
                                                     np.stack([y] * n), keys)
        stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)
        return population_step(steps[0], layout == "sequential").lower(stacked, jnp.zeros(n, bool), np.stack([x] * n),
                                                                       np.stack([y] * n), keys)

    def alone(steps, states):
        return jax.jit(steps[0]).lower(states[0], x, y, jax.random.key(0))

    static = sum(lowered_flops(networks_of(space, group, LAYOUTS[layout]), population)
                 for group in populations(cells, LAYOUTS[layout]))
    own = sum(lowered_flops([standalone_network(space, c, trainable(space, c, key=jax.random.key(0)))], alone)
              for c in cells)
    executed = own if layout == "sequential" else static
    return {"population_step_gflops": executed / 1e9, "xla_static_gflops": static / 1e9, "own_step_gflops": own / 1e9,
            "executed_over_own": executed / own}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", type=int, default=16, help="cells in the population (default: %(default)s)")
    parser.add_argument("--timed-steps", type=int, default=3, help="steps timed after the first (default: %(default)s)")
    parser.add_argument("--torch-networks", type=int, default=4, help="cells torch trains one after another "
                        "(default: %(default)s)")
    parser.add_argument("--space", default="nb201_digits")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    space = rj.nas.space(args.space)
    data = rj.data.digits("train")
    cells = [int(i) for i in np.random.default_rng(0).choice(len(space), args.networks, replace=False)]
    threads = os.cpu_count() or 1
    load_before = os.getloadavg()[0]
    torch_step_s = theirs(space, cells[:args.torch_networks], data, args.timed_steps, threads)
    peak = matmul_peak_gflops()
    rows = []
    for layout in LAYOUTS:
        mine = ours(space, cells, data, args.timed_steps, layout)
        flops = step_flops(space, cells, data, layout)
        steps = mine["steps_per_run"]
        warm = 3600 * args.networks / (steps * mine["step_s"])
        cold = 3600 * args.networks / (mine["first_step_s"] + (steps - 1) * mine["step_s"])
        peer = 3600 / (steps * torch_step_s)
        rows.append({"name": f"pgd7_at_{args.space}_{layout}", "layout": layout, "networks": args.networks,
                     "robustjax_networks_per_hour_warm": warm, "robustjax_networks_per_hour_cold": cold,
                     "peer_networks_per_hour": peer, "ratio_warm": warm / peer, "ratio_cold": cold / peer,
                     "robustjax_step_s": mine["step_s"], "robustjax_first_step_s": mine["first_step_s"],
                     "peer_network_step_s": torch_step_s, **flops,
                     "achieved_gflops": flops["population_step_gflops"] / mine["step_s"], "peak_gflops": peak,
                     # report() prints images/s: the images each side takes through a training step per second
                     "robustjax_images_per_s": args.networks * BATCH_SIZE / mine["step_s"],
                     "peer_images_per_s": BATCH_SIZE / torch_step_s, "ratio": warm / peer,
                     "robustjax_compile_s": max(mine["first_step_s"] - mine["step_s"], 0.0)})
        print(f"{layout}: {args.networks} cells, {steps} steps each ({EPOCHS} epochs of batch {BATCH_SIZE}): "
              f"population {warm:.0f} networks/h warm, {cold:.0f} cold; torch one at a time {peer:.0f} networks/h "
              f"({warm / peer:.2f}x warm, {cold / peer:.2f}x cold); a population step executes "
              f"{flops['executed_over_own']:.2f}x its cells' own FLOPs, {rows[-1]['achieved_gflops']:.1f} GFLOP/s "
              f"(matrix-product peak {peak:.0f})", flush=True)
    settings = {"space": args.space, "cells": cells, "torch_cells": cells[:args.torch_networks],
                "timed_steps": args.timed_steps, "torch_threads": threads,
                "recipe": dataclasses.asdict(recipe(data.num_examples)), "techniques": str(TECHNIQUES),
                "attack": {"eps": EPS, "step_size": STEP_SIZE, "steps": ATTACK_STEPS, "random_start": True},
                "peer": "xautodl TinyNetwork + torchattacks.PGD in a torch training loop, one network at a time",
                "load_average_1min_before_after": [load_before, os.getloadavg()[0]]}
    report(f"training_population_{args.space}", rows, machine_facts(("torch", "torchattacks", "xautodl")), settings,
           args.out)


if __name__ == "__main__":
    main()
