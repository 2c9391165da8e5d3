"""Many networks trained by one jitted step: each with its own parameters, optimizer state,
batch order and random draws (issue 39).

The step is the training step of ``robustjax train`` (:func:`~robustjax.training.step.make_step`)
over the networks, so network ``i`` follows the trajectory it follows trained alone with seed
``seeds[i]``: its batches are ``batch_indices(n, batch_size, seeds[i], step)`` and its draws
``fold_in(key(seeds[i]), step)``. Three layouts (:data:`LAYOUTS`):

- ``"vmap"``: networks of one graph side by side (a zoo architecture with different initial
  weights, or NAS-Bench-201 cells in the shared layout of
  :func:`robustjax.nas.trainable.trainable`, every edge computing every op);
- ``"sequential"``: networks of one graph one after another (``lax.map``), so NB201 cells made
  ``trainable(..., sequential=True)`` compute only their own ops;
- ``"unrolled"``: each network's own step, of its own graph, written one after another into
  the one program: networks of different graphs (NB201 cells at their own shapes, BigNAS
  subnets of different shapes, different zoo architectures) with exactly their own arithmetic.
  The program grows with the networks, and its compile time faster (on a 2-core CPU, PGD-7
  AT of NB201 digits cells: 15-17 s for 2 networks, 42 s for 4, 188 s for 8), so it suits a
  few networks per population; on the 2-core CPU, 2 to a program, it trained 1.9x the
  networks per hour of ``"sequential"`` (``benchmarks/README.md``, ``training_population``).

A network whose loss or new weights are not finite stops: it keeps its last finite state, the
number of steps it completed is recorded, the others go on. Orbax checkpoints hold every
network's state and which have stopped; a killed run started again with the same arguments
ends, bit for bit, where an uninterrupted run ends.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from robustjax.checkpoints import open_checkpoints
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset, batch_indices
from robustjax.training.loop import StepReport, check_training_data, run_steps
from robustjax.training.model import TrainModel
from robustjax.training.recipe import Recipe
from robustjax.training.step import TrainState, init_state, make_step, trained_state
from robustjax.training.techniques import Techniques

LAYOUTS = ("vmap", "sequential", "unrolled")


@dataclasses.dataclass(frozen=True)
class PopulationResult:
    classifiers: tuple[Classifier, ...]  # each trained network (EMA weights when EMA is on), eval mode
    steps: int  # the steps the run reached
    resumed_from: int  # the step a restored checkpoint had reached (0: a fresh run)
    stopped: tuple[int | None, ...]  # per network: the steps it completed before it went non-finite, or None
    last_metrics: dict  # loss and accuracy per network (None for a stopped one), learning_rate, seconds


def train_population(classifiers: Sequence[Classifier], dataset: ImageDataset, out: str | Path,
                     recipe: Recipe = Recipe(), techniques: Techniques = Techniques(), *, seeds: Sequence[int],
                     attack_eps: float | None = None, attack_steps: int | None = None, checkpoint_every: int = 100,
                     log_every: int = 10, on_step: Callable[[StepReport], None] | None = None,
                     stop_after: int | None = None, layout: str = "vmap") -> PopulationResult:
    """Trains every classifier of ``classifiers`` (their current weights are the start) on
    ``dataset`` with ``recipe`` and ``techniques``, network ``i`` with seed ``seeds[i]`` in
    place of ``recipe.seed``. Checkpoints under ``out/checkpoints``; logs every network's loss
    and accuracy to ``out/metrics.jsonl`` every ``log_every`` steps. ``stop_after`` ends the
    call after that many steps (a scheduled interruption). ``layout``: how the networks share
    the program (:data:`LAYOUTS`, the module's docstring). Everything is checked before
    anything compiles: the networks must share their input shape and classes, and, but for
    ``"unrolled"``, one graph."""
    if layout not in LAYOUTS:
        raise ValueError(f"train_population: layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    models = _models(classifiers, seeds, dataset, recipe, techniques, one_graph=layout != "unrolled")
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    num_examples = dataset.num_examples
    total, schedule = recipe.total_steps(num_examples), recipe.schedule(num_examples)
    steps = [make_step(model, recipe, techniques, num_examples, attack_eps=attack_eps, attack_steps=attack_steps)
             for model in (models if layout == "unrolled" else models[:1])]
    optimizer = steps[0][0]  # the recipe's, the same for every network
    own_states = [init_state(model, optimizer, recipe) for model in models]
    if layout == "unrolled":
        # Copies: the step donates every buffer, and the moving average starts as the weights.
        advance, states = unrolled_step(tuple(step for _, step in steps)), jax.tree.map(jnp.array, tuple(own_states))
    else:
        advance, states = population_step(steps[0][1], layout == "sequential"), _stack(own_states)
    stopped = jnp.zeros(len(models), bool)
    meta = json.loads(json.dumps({"networks": [c.name for c in classifiers], "seeds": list(seeds),
                                  "dataset": dataset.name, "num_examples": num_examples,
                                  "recipe": dataclasses.asdict(recipe), "techniques": list(techniques.names),
                                  "attack_eps": attack_eps, "attack_steps": attack_steps,
                                  "layout": layout}))
    manager, start = open_checkpoints(out, meta, "population",
                                      "the same networks, seeds, data, recipe and techniques")
    if start:
        restored = manager.restore(start, args=ocp.args.Composite(
            state=ocp.args.StandardRestore({"states": states, "stopped": stopped}))).state
        # Host round trip: restored arrays come committed to a device, fresh ones not, and
        # the jitted step would compile a second time for the difference.
        restored = jax.tree.map(jnp.asarray, jax.device_get(restored))
        states = (tuple(TrainState(*state) for state in restored["states"]) if layout == "unrolled"
                  else TrainState(*restored["states"]))
        stopped = restored["stopped"]
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
    last = total if stop_after is None else min(total, start + stop_after)

    def step_all(step: int) -> tuple[dict, jax.Array]:
        nonlocal states, stopped
        x, y = _batches(dataset, recipe.batch_size, seeds, step)
        states, stopped, step_metrics = advance(states, stopped, x, y, keys)
        return step_metrics, stopped

    metrics = run_steps(out, manager, meta, range(start, last), total, schedule, step_all, _per_network,
                        lambda: {"states": states, "stopped": stopped}, checkpoint_every=checkpoint_every,
                        log_every=log_every, on_step=on_step)
    own_states = states if layout == "unrolled" else [jax.tree.map(lambda leaf, i=i: leaf[i], states)
                                                      for i in range(len(models))]
    own_states = jax.device_get(own_states)
    trained = tuple(model.eval_classifier(trained_state(model, state)) for model, state in zip(models, own_states))
    completed, stopped = [int(state.step) for state in own_states], np.asarray(stopped)
    return PopulationResult(trained, last, start, tuple(completed[i] if stopped[i] else None
                                                        for i in range(len(models))), metrics)


def _models(classifiers: Sequence[Classifier], seeds: Sequence[int], dataset: ImageDataset, recipe: Recipe,
            techniques: Techniques, *, one_graph: bool) -> list[TrainModel]:
    """The networks' training models, after refusing a population that cannot train as one
    (``one_graph``: networks that must share network 0's graph)."""
    if not classifiers:
        raise ValueError("train_population needs at least one network")
    if len(seeds) != len(classifiers):
        raise ValueError(f"train_population: {len(classifiers)} networks but {len(seeds)} seeds")
    for i, seed in enumerate(seeds):
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed < 2 ** 32:
            raise ValueError(f"network {i} ({classifiers[i].name}): seed must be an int in [0, 2**32), got {seed!r}")
    first = classifiers[0]
    models = []
    for i, classifier in enumerate(classifiers):
        name = f"network {i} ({classifier.name})"
        if (classifier.input_shape, classifier.num_classes) != (first.input_shape, first.num_classes):
            raise ValueError(f"{name} takes {classifier.input_shape} images and {classifier.num_classes} classes, "
                             f"network 0 ({first.name}) {first.input_shape} and {first.num_classes}; a population "
                             "shares its input size and classes")
        check_training_data(classifier, dataset, recipe)
        try:
            model = TrainModel.from_classifier(classifier, dropout="dropout" in techniques,
                                               drop_path=recipe.drop_path_rate)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{name}: {error}") from None
        if one_graph and models and model != models[0]:
            raise ValueError(f"{name} is not of network 0's graph ({first.name}); a population trains networks of "
                             "one graph: a zoo architecture, or NAS-Bench-201 cells from nas.trainable.trainable "
                             "(layout 'unrolled' trains networks of different graphs)")
        models.append(model)
    return models


@functools.cache
def population_step(step: Callable, sequential: bool = False) -> Callable:
    """``step`` over the networks (leading axis) in one jitted program: side by side
    (``vmap``) or one after another (``lax.map``, ``sequential``). A network whose loss or
    new weights are not finite keeps its state and is marked stopped."""
    over_networks = (lambda *args: jax.lax.map(lambda one: step(*one), args)) if sequential else jax.vmap(step)

    @functools.partial(jax.jit, donate_argnums=(0,))
    def advance(states: TrainState, stopped: jax.Array, x, y, keys):
        new, metrics = over_networks(states, x, y, keys)
        kept, now_stopped = jax.vmap(_kept)(new, states, stopped, metrics["loss"])
        return kept, now_stopped, metrics

    return advance


@functools.cache
def unrolled_step(steps: tuple[Callable, ...]) -> Callable:
    """Network ``i``'s own ``steps[i]`` for each network, in one jitted program over a tuple
    of states; the networks' metrics stacked. A network whose loss or new weights are not
    finite keeps its state and is marked stopped."""

    @functools.partial(jax.jit, donate_argnums=(0,))
    def advance(states: tuple[TrainState, ...], stopped: jax.Array, x, y, keys):
        outcomes = [step(state, x[i], y[i], keys[i]) for i, (step, state) in enumerate(zip(steps, states))]
        kept = [_kept(new, state, stopped[i], metrics["loss"])
                for i, ((new, metrics), state) in enumerate(zip(outcomes, states))]
        metrics = jax.tree.map(lambda *values: jnp.stack(values), *[metrics for _, metrics in outcomes])
        return tuple(state for state, _ in kept), jnp.stack([now for _, now in kept]), metrics

    return advance


def _kept(new: TrainState, old: TrainState, stopped: jax.Array, loss: jax.Array) -> tuple[TrainState, jax.Array]:
    """One network's state after a step (``new`` unless it had stopped or went non-finite:
    then ``old``) and whether it is stopped now."""
    finite = jnp.isfinite(loss) & jax.tree.reduce(jnp.logical_and, [jnp.all(jnp.isfinite(leaf))
                                                                     for leaf in jax.tree.leaves(new.params)])
    moving = ~stopped & finite
    return jax.tree.map(lambda n, o: jnp.where(moving, n, o), new, old), stopped | ~finite


def _stack(states: list[TrainState]) -> TrainState:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)


def _batches(dataset: ImageDataset, batch_size: int, seeds: Sequence[int], step: int) -> tuple[np.ndarray, np.ndarray]:
    """Every network's batch of ``step`` (its own order), stacked: (networks, batch, ...)."""
    indices = np.stack([batch_indices(dataset.num_examples, batch_size, int(seed), step) for seed in seeds])
    x, y = dataset.take(indices.reshape(-1))
    return x.reshape(*indices.shape, *x.shape[1:]), y.reshape(indices.shape)


def _per_network(step: tuple[dict, jax.Array]) -> dict:
    """A step's metrics as a list over the networks (None for a stopped network), and the
    stopped networks."""
    metrics, stopped = step
    stopped = np.asarray(stopped)
    return {**{name: [None if stopped[i] else float(v) for i, v in enumerate(np.asarray(values))]
               for name, values in metrics.items()}, "stopped": [int(i) for i in np.flatnonzero(stopped)]}

