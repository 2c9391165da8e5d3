"""Natural noise: the ImageNet-C corruptions, ImageNet-P sequences and system noise.

``corrupt(x, name, severity, key)`` applies one registered corruption; ``names()`` lists
them, ``get(name)`` gives one and ``create(name, severity, preset)`` its pure ``(x, key)``
function. ``perturbation_sequence`` and ``evaluate_sequences`` give ImageNet-P sequences
(``sequences.names()``, ``get``, ``create`` likewise) and their flip probability;
``system`` decodes and resizes images as RobustART's ImageNet-S.
"""

from robustjax.noise import blur as _blur  # noqa: F401  (each module registers its corruptions)
from robustjax.noise import digital as _digital  # noqa: F401
from robustjax.noise import flip, sequences, system
from robustjax.noise import jpeg as _jpeg  # noqa: F401
from robustjax.noise import pixel_noise as _pixel_noise  # noqa: F401
from robustjax.noise import weather as _weather  # noqa: F401
from robustjax.noise.flip import FlipStats, evaluate_sequences, flip_probability, top5_distance
from robustjax.noise.registry import (
    FAMILIES,
    PRESETS,
    SEVERITIES,
    Corruption,
    corrupt,
    create,
    default_preset,
    get,
    names,
    register_corruption,
)
from robustjax.noise.sequences import perturbation_sequence
from robustjax.ops.jpeg import jpeg_round_trip

__all__ = ["FAMILIES", "PRESETS", "SEVERITIES", "Corruption", "FlipStats", "corrupt", "create",
           "default_preset", "evaluate_sequences", "flip", "flip_probability", "get", "jpeg_round_trip", "names",
           "perturbation_sequence", "register_corruption", "sequences", "system", "top5_distance"]
