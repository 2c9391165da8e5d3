"""Model zoo: registered architectures returning :class:`robustjax.Classifier`.

The NAS spaces' networks (``nas.SPACE``) register themselves when :mod:`robustjax.nas` is
imported (NAS builds on the zoo, not the other way round); ``rj.zoo`` imports it for you.
"""

from robustjax.zoo import densenet as _densenet  # noqa: F401  (each module registers its models)
from robustjax.zoo import digits_cnn as _digits_cnn  # noqa: F401
from robustjax.zoo import digits_mlp as _digits_mlp  # noqa: F401
from robustjax.zoo import efficientnet as _efficientnet  # noqa: F401
from robustjax.zoo import mixer as _mixer  # noqa: F401
from robustjax.zoo import mobilenet_v2 as _mobilenet_v2  # noqa: F401
from robustjax.zoo import mobilenet_v3 as _mobilenet_v3  # noqa: F401
from robustjax.zoo import regnet as _regnet  # noqa: F401
from robustjax.zoo import repvgg as _repvgg  # noqa: F401
from robustjax.zoo import resnet as _resnet  # noqa: F401
from robustjax.zoo import resnet18_cifar as _resnet18_cifar  # noqa: F401
from robustjax.zoo import resnet20_56_cifar as _resnet20_56_cifar  # noqa: F401
from robustjax.zoo import shufflenet as _shufflenet  # noqa: F401
from robustjax.zoo import swin as _swin  # noqa: F401
from robustjax.zoo import vit as _vit  # noqa: F401
from robustjax.zoo import wide_resnet as _wide_resnet  # noqa: F401
from robustjax.zoo.convert import convert_checkpoint, from_torch
from robustjax.zoo.registry import (
    card,
    count_flops,
    count_params,
    create,
    get,
    load,
    names,
    register_model,
)
from robustjax.zoo.repvgg import reparameterize as repvgg_reparameterize

__all__ = ["card", "convert_checkpoint", "count_flops", "count_params", "create", "from_torch", "get", "load",
           "names", "register_model", "repvgg_reparameterize"]
