"""Training techniques by name, and which of them combine.

RobustART (Tang et al., arXiv 2109.05211, section 3 of reference/robustart.md) toggles one
technique at a time on its aligned baseline recipe. Here each technique is a name:
:func:`names` lists them, :func:`get` gives one's :class:`Technique` and :func:`create`
turns ``"pgd_at,no_ema"`` into a validated :class:`Techniques` value. Names that cannot act
together (two ways of making the batch, or a switch and its opposite) are refused with the
reason.
"""

from __future__ import annotations

import dataclasses

from robustjax.registry import Registry


@dataclasses.dataclass(frozen=True)
class Technique:
    """A registered technique: its name, its group (techniques of the ``"batch"`` group
    decide what a step trains on and exclude each other, ``"switch"`` ones combine) and
    what it does."""

    name: str
    group: str
    description: str


_TECHNIQUES: Registry[Technique] = Registry("technique")
for _name, (_group, _description) in {
    "pgd_at": ("batch", "RobustART's PGD adversarial training: linf eps 16/255, 20 steps of eps/15, random start, "
                        "examples made with the model in eval mode; the loss is over the clean and the adversarial "
                        "half of a doubled batch"),
    "madry": ("batch", "Madry et al. 2018: linf eps 8/255, 7 steps of 2/255, random start, model in training mode; "
                       "the loss is over the adversarial examples only"),
    "trades": ("batch", "Zhang et al. 2019: CE(clean) + 6 * KL(clean || adversarial), the adversarial examples "
                        "maximising the KL (linf eps 8/255, 10 steps of 2/255)"),
    "fast_at": ("batch", "Wong et al. 2020: one FGSM step of 1.25 eps from a uniform random start, linf eps 8/255"),
    "mixup": ("batch", "Zhang et al. 2018: convex combinations of image pairs and their labels, lambda ~ Beta(0.2, "
                       "0.2); with cutmix, each step one of the two with probability 0.5 (RobustART)"),
    "cutmix": ("batch", "Yun et al. 2019: a box of another image pasted in, labels mixed by its area, "
                        "lambda ~ Beta(1, 1)"),
    "augmix": ("batch", "Hendrycks et al. 2020: 3 chains of 1-3 random operations mixed by Dirichlet(1) weights "
                        "and with the image by Beta(1, 1); loss CE(clean) + 12 * Jensen-Shannon consistency"),
    "no_label_smoothing": ("switch", "cross-entropy on hard labels (the baseline smooths by 0.1)"),
    "no_ema": ("switch", "keep the last weights (the baseline keeps an exponential moving average, decay 0.9999)"),
    "adamw": ("switch", "AdamW (weight decay 0.05, RobustART's ViT settings) instead of SGD for a CNN"),
    "dropout": ("switch", "the model's dropout layers active in training (the baseline trains without)"),
    "drop_path": ("switch", "Huang et al. 2016, stochastic depth: in training each residual branch dropped per "
                            "example, at rate 0.1 (spread along depth by timm's rule for the model), as RobustART's "
                            "ViT-B/16 and Mixer-B/16 'withdrop' (the baseline trains without)"),
    "reparam": ("switch", "RepVGG: write the re-parameterised deploy form (one 3x3 conv per block) of the trained "
                          "network"),
}.items():
    _TECHNIQUES.register(_name, Technique(_name, _group, _description))
ADVERSARIAL = ("pgd_at", "madry", "trades", "fast_at")
MIXING = ("mixup", "cutmix")  # these two combine with each other: RobustART's "augmentation"
DROP_PATH_RATE = 0.1  # the drop_path technique's rate (the recipe's drop_path_rate overrides it)


@dataclasses.dataclass(frozen=True)
class Techniques:
    """A validated set of technique names (sorted, so equal sets compare equal)."""

    names: tuple[str, ...] = ()

    def __contains__(self, name: str) -> bool:
        return name in self.names

    @property
    def adversarial(self) -> str | None:
        """The adversarial-training technique, if any."""
        return next((n for n in self.names if n in ADVERSARIAL), None)

    @property
    def mixing(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n in MIXING)

    def __str__(self) -> str:
        return ",".join(self.names) or "baseline"


def names() -> list[str]:
    """Names of the registered techniques, in registration order."""
    return _TECHNIQUES.names()


def get(name: str) -> Technique:
    """The technique registered as ``name``."""
    return _TECHNIQUES.get(name)


def create(spec: str | list[str] | tuple[str, ...] | None) -> Techniques:
    """``"pgd_at,no_ema"`` (or a list of names) as :class:`Techniques`; empty or None is the
    baseline recipe. Unknown names are refused naming the closest and all valid ones;
    techniques that cannot combine are refused saying why."""
    if spec is None:
        chosen: list[str] = []
    elif isinstance(spec, str):
        chosen = [n.strip() for n in spec.split(",") if n.strip()]
    else:
        chosen = [str(n).strip() for n in spec]
    batch = [n for n in chosen if get(n).group == "batch"]
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"technique list {chosen} names a technique twice")
    if len(batch) > 1 and set(batch) != set(MIXING):
        first, second = batch[0], next(n for n in batch[1:] if not {batch[0], n} <= set(MIXING))
        raise ValueError(f"techniques {first!r} and {second!r} cannot combine: each decides what a step trains on "
                         f"({_what(first)} vs {_what(second)}); choose one (of the batch techniques only mixup and "
                         "cutmix combine, switching with probability 0.5)")
    return Techniques(tuple(sorted(chosen)))


def _what(name: str) -> str:
    if name in ADVERSARIAL:
        return "adversarial examples of integer labels"
    if name in MIXING:
        return "mixed images with soft labels"
    return "augmented views with a consistency loss"
