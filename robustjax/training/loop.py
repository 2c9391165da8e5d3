"""The training loop: batches as a function of (seed, step), data-parallel over the local
devices, orbax checkpoints a killed run resumes from, and a JSON-lines metrics log.

A run that is killed and started again with the same arguments restores its last
checkpoint and continues; because batches and every random draw depend only on (seed,
step), it ends with the parameters an uninterrupted run ends with.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec

from robustjax.checkpoints import open_checkpoints
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset, batch_indices
from robustjax.training.model import TrainModel
from robustjax.training.recipe import Recipe
from robustjax.training.step import TrainState, init_state, make_step, trained_state
from robustjax.training.techniques import Techniques

METRICS_FILE = "metrics.jsonl"


@dataclasses.dataclass(frozen=True)
class StepReport:
    """What the loop tells its caller after each step."""

    step: int
    total: int
    metrics: dict  # loss, accuracy (of the step's batch), learning_rate, seconds


@dataclasses.dataclass(frozen=True)
class TrainResult:
    classifier: Classifier  # the trained network (the EMA weights when EMA is on), eval mode
    steps: int
    resumed_from: int  # the step a restored checkpoint had reached (0: a fresh run)
    last_metrics: dict


def _mesh_shardings(devices):
    mesh = jax.make_mesh((len(devices),), ("batch",), devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,))
    return NamedSharding(mesh, PartitionSpec("batch")), NamedSharding(mesh, PartitionSpec())


def check_training_data(classifier: Classifier, dataset: ImageDataset, recipe: Recipe) -> None:
    """Refuses data the classifier cannot train on, before anything is compiled."""
    if dataset.num_classes > classifier.num_classes:
        raise ValueError(f"dataset {dataset.name!r} has {dataset.num_classes} classes, the model "
                         f"{classifier.name} {classifier.num_classes}; build the model with num_classes="
                         f"{dataset.num_classes}")
    if dataset.image_shape[-1] != classifier.input_shape[-1]:
        raise ValueError(f"dataset {dataset.name!r} has {dataset.image_shape[-1]}-channel images, the model "
                         f"{classifier.name} takes {classifier.input_shape[-1]}")
    if dataset.num_examples < recipe.batch_size:
        raise ValueError(f"dataset {dataset.name!r} has {dataset.num_examples} examples, fewer than one batch "
                         f"of {recipe.batch_size}")


def train(classifier: Classifier, dataset: ImageDataset, out: str | Path, recipe: Recipe = Recipe(),
          techniques: Techniques = Techniques(), *, attack_eps: float | None = None, attack_steps: int | None = None,
          checkpoint_every: int = 100, log_every: int = 10, devices: list | None = None,
          on_step: Callable[[StepReport], None] | None = None, stop_after: int | None = None) -> TrainResult:
    """Trains ``classifier`` (its current weights are the start) on ``dataset`` with
    ``recipe`` and ``techniques``; checkpoints under ``out/checkpoints``, logs to
    ``out/metrics.jsonl`` every ``log_every`` steps.

    A folder holding checkpoints of the same run resumes from the latest; checkpoints of
    another run (other model, data, recipe or techniques) are refused. ``stop_after`` ends
    the call after that many steps (a scheduled interruption, for tests). The batch splits
    over ``devices`` (default: all local devices); ``recipe.batch_size`` must divide by
    their number.
    """
    check_training_data(classifier, dataset, recipe)
    devices = jax.local_devices() if devices is None else list(devices)
    if recipe.batch_size % len(devices):
        raise ValueError(f"batch_size {recipe.batch_size} does not split over {len(devices)} devices; "
                         f"use a multiple of {len(devices)}")
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = TrainModel.from_classifier(classifier, dropout="dropout" in techniques, drop_path=recipe.drop_path_rate)
    num_examples = dataset.num_examples
    total = recipe.total_steps(num_examples)
    schedule = recipe.schedule(num_examples)
    optimizer, step_fn = make_step(model, recipe, techniques, num_examples, attack_eps=attack_eps,
                                   attack_steps=attack_steps)
    batch_sharding, replicated = _mesh_shardings(devices)
    state = jax.device_put(init_state(model, optimizer, recipe), replicated)
    meta = json.loads(json.dumps({"model": classifier.name, "dataset": dataset.name, "num_examples": num_examples,
                                  "recipe": dataclasses.asdict(recipe), "techniques": list(techniques.names),
                                  "attack_eps": attack_eps, "attack_steps": attack_steps}))
    manager, start = open_checkpoints(out, meta, "run", "the same model, data, recipe and techniques")
    if start:
        restored = manager.restore(start, args=ocp.args.Composite(state=ocp.args.StandardRestore(state)))
        state = jax.device_put(TrainState(*restored.state), replicated)
    seed_key = jax.random.key(recipe.seed)
    last = total if stop_after is None else min(total, start + stop_after)

    def advance(step: int) -> dict:
        nonlocal state
        x, y = dataset.take(batch_indices(num_examples, recipe.batch_size, recipe.seed, step))
        state, device_metrics = step_fn(state, jax.device_put(x, batch_sharding), jax.device_put(y, batch_sharding),
                                        seed_key)
        return device_metrics

    metrics = run_steps(out, manager, meta, range(start, last), total, schedule, advance,
                        lambda device_metrics: {k: float(v) for k, v in device_metrics.items()}, lambda: state,
                        checkpoint_every=checkpoint_every, log_every=log_every, on_step=on_step)
    trained = model.eval_classifier(jax.device_get(trained_state(model, state)))
    return TrainResult(trained, last, start, metrics)


def run_steps(out: Path, manager: ocp.CheckpointManager, meta: dict, steps: range, total: int,
              schedule: Callable[[int], Any], advance: Callable[[int], Any], figures: Callable[[Any], dict],
              checkpoint: Callable[[], Any], *, checkpoint_every: int, log_every: int,
              on_step: Callable[[StepReport], None] | None) -> dict:
    """Runs ``advance(step)`` for each of ``steps`` (of ``total``): every ``log_every`` steps
    appends ``figures`` of its metrics to ``out/metrics.jsonl`` (dropping lines a killed run
    wrote past ``steps.start``), reports each step to ``on_step``, and saves ``checkpoint()``
    with ``meta`` every ``checkpoint_every`` steps and at the end. Closes ``manager``; returns
    the last figures logged or reported."""
    _truncate_log(out / METRICS_FILE, steps.start)
    metrics: dict = {}
    started = time.perf_counter()
    try:
        with (out / METRICS_FILE).open("a") as log:
            for step in steps:
                step_metrics = advance(step)
                done = step + 1
                if done % log_every == 0 or done == steps.stop or on_step is not None:
                    metrics = {"step": done, **figures(step_metrics), "learning_rate": float(schedule(step)),
                               "seconds": round(time.perf_counter() - started, 3)}
                    if done % log_every == 0 or done == total:
                        log.write(json.dumps(metrics) + "\n")
                        log.flush()
                    if on_step is not None:
                        on_step(StepReport(done, total, metrics))
                if done % checkpoint_every == 0 or done == total:
                    manager.save(done, args=ocp.args.Composite(state=ocp.args.StandardSave(checkpoint()),
                                                               meta=ocp.args.JsonSave(meta)))
    finally:
        manager.wait_until_finished()
        manager.close()
    return metrics


def _truncate_log(path: Path, step: int) -> None:
    """Drops the log lines of steps after ``step`` (a killed run logged past its last checkpoint)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))
