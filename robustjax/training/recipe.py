"""RobustART's aligned training recipe as a frozen value, and the optax optimizer it makes.

Aligned baseline (reference/robustart.md, section 3; DIG-Beihang/RobustART
exprs/robust_baseline_exp): CNNs train with SGD (Nesterov, momentum 0.9, weight decay
1e-4), the learning rate warmed up linearly from 0.1 to 0.4 over 2 epochs and then
cosine-decayed to 0 over the rest of 100 epochs, batch 512, label smoothing 0.1 and an
exponential moving average of the weights (decay 0.9999). ViT/DeiT train with AdamW
(weight decay 0.05, warm-up 1e-5 -> 5e-4, cosine to 1e-5), MLP-Mixer likewise with warm-up
1e-6 -> 1e-3. The baseline's image augmentation is ``STANDARD`` (random resized crop, flip,
colour jitter; :mod:`robustjax.training.augment`), applied inside the training step.
"""

from __future__ import annotations

import dataclasses

import optax

from robustjax.checks import check_positive_int
from robustjax.training.augment import check_augmentation
from robustjax.training.techniques import DROP_PATH_RATE, Techniques

OPTIMIZERS = ("sgd", "adamw")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Hyperparameters of a training run; the defaults are RobustART's CNN baseline.

    The length is ``steps`` if given, else ``epochs`` passes over the training set; the
    warm-up lasts ``warmup_epochs`` (at most half the run). The moving average's decay at
    update ``t`` (from 0) is ``min(ema_decay, (1 + t) / (10 + t))``, the warm-up of
    TensorFlow's ``ExponentialMovingAverage(num_updates=t)``: without it a short run's average
    at 0.9999 would stay at the initial weights. ``augment`` names the per-image training
    augmentation (``"none"`` here; :func:`aligned` chooses it per model family);
    ``drop_path_rate`` is the network's stochastic-depth rate (0: off; the ``drop_path``
    technique's is 0.1).
    """

    optimizer: str = "sgd"
    learning_rate: float = 0.4  # after warm-up
    warmup_from: float = 0.1
    final_learning_rate: float = 0.0
    warmup_epochs: float = 2.0
    epochs: float = 100.0
    steps: int | None = None
    batch_size: int = 512
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 1e-4
    label_smoothing: float = 0.1
    ema_decay: float | None = 0.9999
    augment: str = "none"
    drop_path_rate: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        check_positive_int(self.batch_size, "batch_size")
        if self.steps is not None:
            check_positive_int(self.steps, "steps")
        if not self.epochs > 0 or self.warmup_epochs < 0:
            raise ValueError(f"epochs must be > 0 and warmup_epochs >= 0, got {self.epochs} and {self.warmup_epochs}")
        if not (self.learning_rate > 0 and self.warmup_from >= 0 and self.final_learning_rate >= 0):
            raise ValueError("learning rates must be >= 0 (the peak one > 0)")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must lie in [0, 1), got {self.label_smoothing}")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise ValueError(f"ema_decay must lie in (0, 1) or be None (no EMA), got {self.ema_decay}")
        check_augmentation(self.augment)
        if not 0 <= self.drop_path_rate < 1:
            raise ValueError(f"drop_path_rate must lie in [0, 1), got {self.drop_path_rate}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")

    def total_steps(self, num_examples: int) -> int:
        return self.steps if self.steps is not None else max(1, round(self.epochs * self.steps_per_epoch(num_examples)))

    def steps_per_epoch(self, num_examples: int) -> int:
        return max(1, num_examples // self.batch_size)

    def warmup_steps(self, num_examples: int) -> int:
        total = self.total_steps(num_examples)
        return min(round(self.warmup_epochs * self.steps_per_epoch(num_examples)), total // 2)

    def schedule(self, num_examples: int) -> optax.Schedule:
        """Linear warm-up from ``warmup_from`` to ``learning_rate``, then cosine decay to
        ``final_learning_rate`` at the last step."""
        total, warmup = self.total_steps(num_examples), self.warmup_steps(num_examples)
        return optax.warmup_cosine_decay_schedule(self.warmup_from, self.learning_rate, warmup, total,
                                                  end_value=self.final_learning_rate)

    def make_optimizer(self, num_examples: int) -> optax.GradientTransformation:
        schedule = self.schedule(num_examples)
        if self.optimizer == "adamw":
            return optax.adamw(schedule, weight_decay=self.weight_decay)
        return optax.chain(optax.add_decayed_weights(self.weight_decay),
                           optax.sgd(schedule, momentum=self.momentum, nesterov=self.nesterov))


VIT_FAMILIES = ("vit", "deit", "swin")
MIXER_FAMILIES = ("mlp_mixer", "mixer")
# Augmentation by family: RobustART's STANDARD for the ImageNet-scale zoo, the CIFAR one for
# CIFAR networks; none for the digits and NAS networks (the bundled spaces train on digits,
# which a flip would turn into other symbols) and for families not listed here.
STANDARD_FAMILIES = ("resnet", "regnetx", "efficientnet", "mobilenet_v2", "mobilenet_v3", "shufflenet_v2",
                     "densenet", "repvgg", *VIT_FAMILIES, *MIXER_FAMILIES)
CIFAR_FAMILIES = ("resnet_cifar", "cifar_resnet", "wide_resnet")


def default_augment(family: str) -> str:
    """The training augmentation a model family gets by default (see the families above)."""
    family = family.lower()
    return "standard" if family in STANDARD_FAMILIES else "pad_crop_flip" if family in CIFAR_FAMILIES else "none"


def aligned(family: str, techniques: Techniques = Techniques(), **overrides) -> Recipe:
    """RobustART's aligned recipe for a model family (SGD for CNNs, AdamW for ViT-like and
    Mixer models; the family's augmentation, :func:`default_augment`), with the switches of
    ``techniques`` applied, then ``overrides`` (any :class:`Recipe` fields)."""
    fields: dict = {"augment": default_augment(family)}
    family = family.lower()
    if any(family.startswith(f) for f in MIXER_FAMILIES):
        fields.update(optimizer="adamw", weight_decay=0.05, warmup_from=1e-6, learning_rate=1e-3,
                      final_learning_rate=1e-5)
    elif any(family.startswith(f) for f in VIT_FAMILIES) or "adamw" in techniques:
        fields.update(optimizer="adamw", weight_decay=0.05, warmup_from=1e-5, learning_rate=5e-4,
                      final_learning_rate=1e-5)
    if "no_label_smoothing" in techniques:
        fields["label_smoothing"] = 0.0
    if "no_ema" in techniques:
        fields["ema_decay"] = None
    if "drop_path" in techniques:
        fields["drop_path_rate"] = DROP_PATH_RATE
    return Recipe(**{**fields, **overrides})
