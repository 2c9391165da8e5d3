"""The training step: one jitted program that augments the images (the recipe's
augmentation), makes the step's batch from them (adversarial examples with robustjax's own
attacks, mixed or AugMix images), computes the loss, updates the weights with optax and the
moving average of the weights.

Every random draw of a step is a function of (seed, step), so a step is the same whether
the run was interrupted before it or not.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from robustjax.attacks import PGD
from robustjax.classifier import Classifier
from robustjax.training import augment, mixing
from robustjax.training.model import TrainModel
from robustjax.training.recipe import Recipe
from robustjax.training.techniques import Techniques

TRADES_BETA = 6.0
AUGMIX_JSD_WEIGHT = 12.0
AUGMENT_STREAM = 1  # the augmentation's key: fold_in(step key, 1); the step key itself splits for the rest


@dataclasses.dataclass(frozen=True)
class AttackSettings:
    """The inner attack of an adversarial-training technique (linf PGD)."""

    eps: float
    steps: int
    step_size: float
    random_start: bool = True
    batch_statistics: bool = False  # attack the network in training mode (else eval mode)


def attack_settings(technique: str, eps: float | None = None, steps: int | None = None) -> AttackSettings:
    """A technique's attack; ``eps`` and ``steps`` override the published ones, the step
    size keeping its published ratio to them."""
    if technique == "pgd_at":  # RobustART: 16/255, 20 steps, relative step 1/15 (foolbox rel_stepsize)
        eps = 16 / 255 if eps is None else eps
        return AttackSettings(eps, steps or 20, eps / 15)
    if technique == "madry":  # Madry et al. CIFAR-10: 8/255, 7 steps of 2/255
        eps = 8 / 255 if eps is None else eps
        return AttackSettings(eps, steps or 7, eps / 4, batch_statistics=True)
    if technique == "trades":  # Zhang et al. CIFAR-10: 0.031, 10 steps of 0.007
        eps = 8 / 255 if eps is None else eps
        return AttackSettings(eps, steps or 10, eps / 4)
    if technique == "fast_at":  # Wong et al. 2020: alpha = 1.25 eps from a uniform random start
        eps = 8 / 255 if eps is None else eps
        return AttackSettings(eps, 1, 1.25 * eps, batch_statistics=True)
    raise ValueError(f"{technique!r} is not an adversarial-training technique")


class TrainState(NamedTuple):
    """Everything a run carries from step to step (and checkpoints)."""

    step: jax.Array
    params: Any
    stats: Any
    other: Any
    opt_state: Any
    ema: Any  # (params, stats) averaged, or () without EMA


def soft_targets(y: jax.Array, num_classes: int, smoothing: float) -> jax.Array:
    """One-hot labels smoothed (Szegedy et al. 2016): ``(1 - s) * onehot + s / K``."""
    return optax.smooth_labels(jax.nn.one_hot(y, num_classes), smoothing)


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean cross-entropy against probability targets."""
    return optax.losses.softmax_cross_entropy(logits, targets).mean()


def kl_divergence(p_logits: jax.Array, q_logits: jax.Array) -> jax.Array:
    """Per-example KL(softmax(p) || softmax(q))."""
    log_p, log_q = jax.nn.log_softmax(p_logits), jax.nn.log_softmax(q_logits)
    return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def jensen_shannon(*logits: jax.Array) -> jax.Array:
    """Mean Jensen-Shannon divergence of several predictions (AugMix's consistency loss)."""
    probs = [jax.nn.softmax(z) for z in logits]
    log_mix = jnp.log(jnp.clip(sum(probs) / len(probs), 1e-7, 1.0))
    return sum(jnp.sum(p * (jnp.log(jnp.clip(p, 1e-7, 1.0)) - log_mix), -1) for p in probs).mean() / len(probs)


@dataclasses.dataclass(frozen=True)
class KLObjective:
    """``apply_fn`` under which PGD's cross-entropy ascends TRADES' KL: two logits
    ``[0, KL(p_clean || p(x))]``, label 0, so the cross-entropy is ``softplus(KL)``, an
    increasing function of the KL whose gradient is the KL's times a positive factor per
    example; linf steps follow its sign, so the iterates are those of an ascent on the KL."""

    inner: Any

    def __call__(self, params, x):
        network, clean_logits = params
        return jnp.stack([jnp.zeros(x.shape[0]), kl_divergence(clean_logits, self.inner(network, x))], axis=-1)


def trades_classifier(classifier: Classifier, clean_logits: jax.Array) -> Classifier:
    return classifier.replace(params=(classifier.params, jax.lax.stop_gradient(clean_logits)),
                              apply_fn=KLObjective(classifier.apply_fn), num_classes=2, features_fn=None)


def adversarial_examples(settings: AttackSettings, classifier: Classifier, x, y, key) -> jax.Array:
    """robustjax's linf PGD (the last iterate, no early stop) against ``classifier``, fully
    unrolled on the CPU: over a 250-step run of NB201 digits cells the rolled loop's shorter
    compile (26% less) and slower steps (3%) cancel, and XLA's cost analysis counts every step."""
    attack = PGD(eps=settings.eps, norm="linf", steps=settings.steps, step_size=settings.step_size,
                 random_start=settings.random_start, early_stop=False, unroll=None)
    return jax.lax.stop_gradient(attack(classifier, x, y, key=key).x_adv)


def init_state(model: TrainModel, optimizer: optax.GradientTransformation, recipe: Recipe) -> TrainState:
    params, stats, other = model.split(model.classifier.params)
    ema = (params, stats) if recipe.ema_decay is not None else ()
    return TrainState(jnp.zeros((), jnp.int32), params, stats, other, optimizer.init(params), ema)


def ema_decay_at(decay: float, update: jax.Array) -> jax.Array:
    """The moving average's decay at ``update`` (0, 1, ...): ``min(decay, (1 + t) / (10 + t))``."""
    return jnp.minimum(decay, (1.0 + update) / (10.0 + update))


def ema_update(ema, new, decay):
    """``decay * ema + (1 - decay) * new``, leaf by leaf."""
    return jax.tree.map(lambda e, n: decay * e + (1 - decay) * n, ema, new)


@functools.cache
def make_step(model: TrainModel, recipe: Recipe, techniques: Techniques, num_examples: int, *,
              attack_eps: float | None = None, attack_steps: int | None = None):
    """The optimizer of ``recipe`` and the jitted ``step(state, x, y, seed_key) -> (state,
    metrics)`` for ``x`` in [0, 1] (cached: runs of one architecture and settings in a
    process share the compiled step)."""
    if ("drop_path" in techniques) != (recipe.drop_path_rate > 0) or model.drop_path != recipe.drop_path_rate:
        raise ValueError(f"technique 'drop_path' and a recipe drop_path_rate > 0 go together, and the model's drop-path "
                         f"rate is the recipe's: got techniques {techniques}, drop_path_rate {recipe.drop_path_rate}, "
                         f"model rate {model.drop_path} (training.aligned sets the technique's rate)")
    optimizer = recipe.make_optimizer(num_examples)
    clf0 = model.classifier
    k = clf0.num_classes
    adversarial = techniques.adversarial
    settings = attack_settings(adversarial, attack_eps, attack_steps) if adversarial else None
    mixes = techniques.mixing

    def loss_fn(params, stats, other, x, y, key):
        targets = soft_targets(y, k, recipe.label_smoothing)
        data_key, drop_key = jax.random.split(key)
        state = model.join(params, stats, other)
        frozen = jax.lax.stop_gradient(state)

        def forward(images):
            return model.train_logits(params, stats, other, clf0.normalize(images), drop_key)

        if adversarial in ("pgd_at", "madry", "fast_at"):
            victim = model.batch_stats_classifier(frozen) if settings.batch_statistics else model.eval_classifier(frozen)
            x_adv = adversarial_examples(settings, victim, x, y, data_key)
            if adversarial == "pgd_at":  # RobustART: the clean and the adversarial half in one batch
                logits, new_stats = forward(jnp.concatenate([x, x_adv]))
                return cross_entropy(logits, jnp.concatenate([targets, targets])), (logits[: x.shape[0]], new_stats)
            logits, new_stats = forward(x_adv)
            return cross_entropy(logits, targets), (logits, new_stats)
        if adversarial == "trades":
            victim = model.eval_classifier(frozen)
            x_adv = adversarial_examples(settings, trades_classifier(victim, victim(x)), x, jnp.zeros_like(y), data_key)
            logits, new_stats = forward(jnp.concatenate([x, x_adv]))
            clean, adv = logits[: x.shape[0]], logits[x.shape[0]:]
            return cross_entropy(clean, targets) + TRADES_BETA * kl_divergence(clean, adv).mean(), (clean, new_stats)
        if mixes:
            x_mix, mixed = mixing.mixup_or_cutmix(data_key, x, targets, use_mixup="mixup" in mixes,
                                                  use_cutmix="cutmix" in mixes)
            logits, new_stats = forward(x_mix)
            return cross_entropy(logits, mixed), (logits, new_stats)
        if "augmix" in techniques:
            first, second = jax.random.split(data_key)
            logits, new_stats = forward(jnp.concatenate([x, mixing.augmix(first, x), mixing.augmix(second, x)]))
            clean, aug1, aug2 = jnp.split(logits, 3)
            return cross_entropy(clean, targets) + AUGMIX_JSD_WEIGHT * jensen_shannon(clean, aug1, aug2), (clean, new_stats)
        logits, new_stats = forward(x)
        return cross_entropy(logits, targets), (logits, new_stats)

    @jax.jit
    def step(state: TrainState, x, y, seed_key):
        key = jax.random.fold_in(seed_key, state.step)
        x = augment.augment(recipe.augment, jax.random.fold_in(key, AUGMENT_STREAM), x)
        (loss, (logits, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, state.stats, state.other, x, y, key)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        ema = (ema_update(state.ema, (params, stats), ema_decay_at(recipe.ema_decay, state.step))
               if recipe.ema_decay is not None else ())
        metrics = {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == y)}
        return TrainState(state.step + 1, params, stats, state.other, opt_state, ema), metrics

    return optimizer, step


def trained_state(model: TrainModel, state: TrainState, *, ema: bool = True):
    """The classifier state a run ends with: the moving average when kept, else the weights."""
    params, stats = state.ema if (ema and state.ema != ()) else (state.params, state.stats)
    return model.join(params, stats, state.other)
