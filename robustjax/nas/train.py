"""Supernet training with optax, resumable from orbax checkpoints.

BigNAS spaces train by the sandwich rule with in-place distillation (Yu et al., "BigNAS",
ECCV 2020): every step runs the largest subnet on the labels, then the smallest and
``random_subnets`` random subnets on the largest one's (stop-gradient) soft predictions,
and applies the sum of their gradients. NAS-Bench-201 trains by uniform single-path
sampling (Guo et al., "Single Path One-Shot", ECCV 2020): every step one uniformly drawn
cell, on the labels. The random subnets of a step share one random resolution, so a space of
R resolutions compiles at most R training steps.

Every draw (batch order, subnets) is a function of the seed and the step, and the state is
checkpointed every ``checkpoint_every`` steps, so a run killed at any moment and started
again with the same arguments continues from its last checkpoint and ends with the weights
an uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

from robustjax.checkpoints import open_checkpoints
from robustjax.data.dataset import batch_indices
from robustjax.nas import build
from robustjax.nas.bignas import BigNASSpace
from robustjax.nas.supernet import Supernet, describe_space


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Hyperparameters of a supernet training run (Adam with a cosine-decayed step size)."""

    steps: int = 2000
    batch_size: int = 64
    learning_rate: float = 2e-3
    random_subnets: int = 2  # BigNAS: random subnets between the largest and the smallest
    distill: bool = True  # BigNAS: in-place distillation from the largest subnet
    checkpoint_every: int = 100
    seed: int = 0

    def __post_init__(self):
        for field in ("steps", "batch_size", "checkpoint_every"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be >= 1, got {getattr(self, field)}")
        if self.random_subnets < 0 or self.learning_rate <= 0:
            raise ValueError("random_subnets must be >= 0 and learning_rate > 0")


def step_subnets(space: build.Space, settings: TrainSettings, step: int) -> list:
    """The subnets trained at ``step``: the sandwich for BigNAS, one uniform cell for NB201."""
    key = jax.random.fold_in(jax.random.key(settings.seed), step)
    if isinstance(space, BigNASSpace):
        side_key, subnet_key = jax.random.split(key)
        side = space.resolutions[int(jax.random.randint(side_key, (), 0, len(space.resolutions)))]
        drawn = [dataclasses.replace(c, resolution=side)
                 for c in space.sample(subnet_key, settings.random_subnets, unique=False)]
        return [space.largest(), space.smallest(), *drawn]
    return space.sample(key, 1, unique=False)


@functools.cache
def _optimizer_and_step(graphdef, learning_rate: float, steps: int, distill: bool):
    """Adam with cosine decay, and the jitted training step (cached, so that runs of one
    space and settings in one process share the compiled step)."""
    optimizer = optax.adam(optax.cosine_decay_schedule(learning_rate, steps))

    @functools.partial(jax.jit, static_argnums=6)
    def train_step(params, stats, opt_state, x, y, choices, resolutions: tuple[int, ...]):
        def loss_fn(params):
            total, teacher, new_stats = 0.0, None, stats
            for i, side in enumerate(resolutions):
                model = nnx.merge(graphdef, params, stats, copy=True)
                logits = model(build.resize_to(x, side), jax.tree.map(lambda a, i=i: a[i], choices))
                if i == 0:
                    new_stats = nnx.state(model, nnx.BatchStat)
                    teacher = jax.lax.stop_gradient(jax.nn.softmax(logits))
                if i == 0 or not distill:
                    loss = optax.losses.softmax_cross_entropy_with_integer_labels(logits, y).mean()
                else:
                    loss = optax.losses.softmax_cross_entropy(logits, teacher).mean()
                total = total + loss
            return total, new_stats

        (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_stats, opt_state, loss

    return optimizer, train_step


def train_supernet(space: build.Space, images: np.ndarray, labels: np.ndarray, out: str | Path,
                   settings: TrainSettings = TrainSettings(), *,
                   log: Callable[[int, float], None] | None = None,
                   stop_after: int | None = None) -> Supernet:
    """Trains (or resumes training) the supernet of ``space`` on [0, 1] ``images``.

    Checkpoints go to ``out/checkpoints``; a checkpoint of another space or other settings
    is refused. ``log(step, loss)`` is called at every checkpoint. ``stop_after`` ends the
    run after that many steps of this call (a scheduled interruption, for tests).
    """
    images = np.asarray(images, np.float32)
    labels = np.asarray(labels, np.int32)
    if images.shape[1:] != space.input_shape or len(images) != len(labels):
        raise ValueError(f"{space.name} trains on images of shape (N, {space.input_shape}) with N labels, "
                         f"got images {images.shape} and labels {labels.shape}")
    if labels.min() < 0 or labels.max() >= space.num_classes:
        raise ValueError(f"labels must lie in [0, {space.num_classes}), got [{labels.min()}, {labels.max()}]")
    supernet = Supernet.create(space, key=jax.random.key(settings.seed))
    module = supernet.module()
    module.train()
    graphdef, params, stats = nnx.split(module, nnx.Param, nnx.BatchStat)
    optimizer, train_step = _optimizer_and_step(graphdef, settings.learning_rate, settings.steps, settings.distill)
    opt_state = optimizer.init(params)
    meta = json.loads(json.dumps({"space": describe_space(space), "settings": dataclasses.asdict(settings)}))
    manager, start = open_checkpoints(Path(out), meta, "run", "the same space and settings")
    if start:
        restored = manager.restore(start, args=ocp.args.Composite(
            state=ocp.args.StandardRestore({"params": params, "stats": stats, "opt_state": opt_state})))
        params, stats, opt_state = (restored.state[k] for k in ("params", "stats", "opt_state"))
    loss = float("nan")
    last = settings.steps if stop_after is None else min(settings.steps, start + stop_after)
    for step in range(start, last):
        batch = batch_indices(len(labels), settings.batch_size, settings.seed, step)
        x = (images[batch] - np.float32(space.mean)) / np.float32(space.std)
        configs = step_subnets(space, settings, step)
        choices = jax.tree.map(lambda *a: np.stack(a), *[build.choice(space, c) for c in configs])
        resolutions = tuple(build.resolution(space, c) for c in configs)
        params, stats, opt_state, loss = train_step(params, stats, opt_state, x, labels[batch], choices, resolutions)
        if (step + 1) % settings.checkpoint_every == 0 or step + 1 == settings.steps:
            manager.save(step + 1, args=ocp.args.Composite(
                state=ocp.args.StandardSave({"params": params, "stats": stats, "opt_state": opt_state}),
                meta=ocp.args.JsonSave(meta)))
            if log is not None:
                log(step + 1, float(loss))
    manager.wait_until_finished()
    manager.close()
    module = nnx.merge(graphdef, params, stats)
    module.eval()
    return Supernet.from_module(space, module)
