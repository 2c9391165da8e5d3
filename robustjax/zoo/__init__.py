"""Model zoo: registered architectures returning :class:`robustjax.Classifier`."""

from robustjax.zoo import digits_cnn as _digits_cnn  # noqa: F401  (registers the model)
from robustjax.zoo import resnet_cifar as _resnet_cifar  # noqa: F401  (registers the model)
from robustjax.zoo.convert import convert_checkpoint, from_torch
from robustjax.zoo.registry import card, count_flops, count_params, create, get_entry, list_models, register_model

__all__ = ["card", "convert_checkpoint", "count_flops", "count_params", "create", "from_torch", "get_entry",
           "list_models", "register_model"]
