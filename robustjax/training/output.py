"""A trained network on disk, as the zoo reads it: ``weights/`` and a ``card.json`` that
records the recipe, so ``robustjax evaluate --model NAME --weights DIR`` evaluates it."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import flax
import jax
import optax

from robustjax.training.recipe import Recipe
from robustjax.training.techniques import Techniques
from robustjax.training.techniques import get as get_technique
from robustjax.zoo.registry import count_params
from robustjax.zoo.registry import get as get_model
from robustjax.zoo.weights import save_weights


def check_model_for(model: str, techniques: Techniques) -> None:
    """Refuses techniques the zoo model ``model`` cannot take (before training)."""
    entry = get_model(model)
    if "reparam" in techniques and (entry.family != "repvgg" or model.endswith("_deploy")):
        raise ValueError(f"technique 'reparam' fuses a training-time RepVGG into its deploy form; {model!r} is "
                         f"{'already the deploy form' if model.endswith('_deploy') else 'not a RepVGG'}")


def trained_name(model: str, techniques: Techniques) -> str:
    """The zoo name a model trained with ``techniques`` is evaluated as: with ``reparam``,
    its deploy form's."""
    return f"{model}_deploy" if "reparam" in techniques else model


def save_trained(out: str | Path, result, *, model: str, recipe: Recipe, techniques: Techniques,
                 dataset: str, build_kwargs: dict | None = None, extra: dict | None = None) -> Path:
    """Writes ``out/weights`` and ``out/card.json`` for ``result`` (a ``TrainResult``) of the
    zoo model ``model``; with the ``reparam`` technique, the deploy form under the name
    ``<model>_deploy``. Returns the name to evaluate it as."""
    classifier, name = result.classifier, trained_name(model, techniques)
    if "reparam" in techniques:
        from robustjax.zoo.repvgg import reparameterize

        classifier = reparameterize(classifier)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_weights(out / "weights", classifier.params)
    card = {
        "name": name,
        "family": get_model(name).family,
        "num_classes": classifier.num_classes,
        "build_kwargs": build_kwargs or {},
        "num_params": count_params(classifier),
        "input_shape": list(classifier.input_shape),
        "normalization": {"mean": list(classifier.mean), "std": list(classifier.std)},
        "weights": {
            "source": f"trained by robustjax train ({', '.join(techniques.names) or 'baseline recipe'})",
            "format": "orbax-checkpoint, nnx.to_pure_dict layout",
        },
        "training": {
            "dataset": dataset,
            "techniques": {n: get_technique(n).description for n in techniques.names},
            "recipe": dataclasses.asdict(recipe),
            "steps": result.steps,
            "final_metrics": result.last_metrics,
            **(extra or {}),
        },
        "versions": {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__},
    }
    partial = out / "card.json.partial"  # the card comes last, whole: a folder with one holds finished weights
    partial.write_text(json.dumps(card, indent=2) + "\n")
    os.replace(partial, out / "card.json")
    return name
