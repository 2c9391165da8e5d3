"""MobileNetV2, MobileNetV3-Large (RobustART's) and EfficientNet ports: logits and
activations equal PyTorch's on reduced models, parameter counts equal at full size, and bad
state dicts are named."""

import functools

import jax
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax.zoo import efficientnet, mobilenet_v2, mobilenet_v3
from robustjax.zoo.abstract import build_abstract
from robustjax.zoo.convert import TorchWeights, from_torch
from robustjax.zoo.weights import check_compatible

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
nn = torch.nn

MOBILENET_V2 = [f"mobilenet_v2_{s}" for s in mobilenet_v2.WIDTHS]
MOBILENET_V3 = [f"mobilenet_v3_large_{s}" for s in mobilenet_v3.WIDTHS]
EFFICIENTNET = list(efficientnet.VARIANTS)
# RobustART's table (reference/robustart.md section 2.1), parameters in millions, 2 decimals.
ROBUSTART_MILLIONS = {
    "mobilenet_v2_x0_5": 1.97, "mobilenet_v2_x0_75": 2.64, "mobilenet_v2_x1_0": 3.50, "mobilenet_v2_x1_4": 6.11,
    "mobilenet_v3_large_x0_35": 2.10, "mobilenet_v3_large_x0_5": 2.67, "mobilenet_v3_large_x0_75": 3.91,
    "mobilenet_v3_large_x1_0": 5.48, "mobilenet_v3_large_x1_4": 9.97,
    "efficientnet_b0": 5.29, "efficientnet_b1": 7.79, "efficientnet_b2": 9.11, "efficientnet_b3": 12.23,
    "efficientnet_b4": 19.34, "efficientnet_b5": 30.39, "efficientnet_b6": 43.04, "efficientnet_b7": 66.35,
}
IMAGE_SIZE = 32
NUM_CLASSES = 10


# A PyTorch twin of RobustART's MobileNetV3-Large (prototype/model/mobilenet_v3.py), whose
# package cannot be imported here (it needs SenseTime's linklink).
class TorchHardSwish(nn.Module):
    def forward(self, x):
        return x * nn.functional.relu6(x + 3.0) / 6.0


class TorchSqueezeExcite(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(channels, channels // 4, bias=False), nn.ReLU(),
                                nn.Linear(channels // 4, channels, bias=False), nn.Hardsigmoid())

    def forward(self, x):
        return x * self.fc(x.mean(dim=(2, 3)))[:, :, None, None]


class TorchV3Block(nn.Module):
    def __init__(self, inp, out, kernel, stride, expanded, squeeze_excite, hard_swish):
        super().__init__()
        act = TorchHardSwish if hard_swish else nn.ReLU
        layers = [nn.Conv2d(inp, expanded, 1, bias=False), nn.BatchNorm2d(expanded), act()] if inp != expanded else []
        layers += [nn.Conv2d(expanded, expanded, kernel, stride, kernel // 2, groups=expanded, bias=False),
                   nn.BatchNorm2d(expanded), TorchSqueezeExcite(expanded) if squeeze_excite else nn.Identity(), act(),
                   nn.Conv2d(expanded, out, 1, bias=False), nn.BatchNorm2d(out)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and inp == out

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


class TorchMobileNetV3Large(nn.Module):
    def __init__(self, scale, num_classes=1000, setting=mobilenet_v3.LARGE_SETTING):
        super().__init__()
        divisible = mobilenet_v2.make_divisible
        last = divisible(1280 * scale) if scale > 1.0 else 1280
        layers = [nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), TorchHardSwish())]
        inp = 16
        for kernel, expanded, channels, squeeze_excite, hard_swish, stride in setting:
            out = divisible(channels * scale)
            layers.append(TorchV3Block(inp, out, kernel, stride, divisible(expanded * scale), squeeze_excite,
                                       hard_swish))
            inp = out
        head = divisible(960 * scale)
        layers += [nn.Sequential(nn.Conv2d(inp, head, 1, bias=False), nn.BatchNorm2d(head), TorchHardSwish()),
                   nn.AdaptiveAvgPool2d(1), nn.Conv2d(head, last, 1), TorchHardSwish()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.8), nn.Linear(last, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def torch_full_size(name: str):
    """The full-size PyTorch model of a registered name (build it on the meta device)."""
    if name.startswith("mobilenet_v2"):
        return torchvision.models.mobilenet_v2(width_mult=mobilenet_v2.WIDTHS[name.removeprefix("mobilenet_v2_")])
    if name.startswith("mobilenet_v3"):
        return TorchMobileNetV3Large(mobilenet_v3.WIDTHS[name.removeprefix("mobilenet_v3_large_")])
    return getattr(torchvision.models, name)()


def randomize(model: "nn.Module") -> "nn.Module":
    """Non-trivial BatchNorm statistics and affine terms, and a classifier large enough that
    logits are of order one; eval mode."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                shape = module.running_mean.shape
                module.running_mean.copy_(0.2 * torch.randn(shape, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(shape, generator=generator))
                module.weight.copy_(0.5 + torch.rand(shape, generator=generator))
                module.bias.copy_(0.1 * torch.randn(shape, generator=generator))
        head = model.classifier[-1]
        head.weight.copy_(10.0 * torch.randn(head.weight.shape, generator=generator) / head.in_features ** 0.5)
    return model.eval()


def converted(module: nnx.Module, convert, torch_model: "nn.Module") -> rj.Classifier:
    """``module`` as a Classifier carrying ``torch_model``'s weights, as ``from_torch`` does."""
    clf = rj.Classifier.from_nnx(module, num_classes=NUM_CLASSES, input_shape=(IMAGE_SIZE, IMAGE_SIZE, 3),
                                 mean=mobilenet_v2.IMAGENET_MEAN, std=mobilenet_v2.IMAGENET_STD)
    weights = TorchWeights({k: v.numpy() for k, v in torch_model.state_dict().items()})
    params = convert(weights)
    weights.check_all_used()
    check_compatible(nnx.to_pure_dict(clf.params), params, "torch model")
    state = clf.params
    nnx.replace_by_pure_dict(state, params)
    return clf.replace(params=state)


def assert_parity(clf: rj.Classifier, torch_model: "nn.Module", layers: tuple[str, ...]) -> None:
    """Logits and the outputs of ``layers`` (torch forward hooks vs ``Classifier.features``)
    agree on random images."""
    images = np.random.default_rng(1).uniform(size=(2, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.float32)
    normalised = (images - np.float32(clf.mean)) / np.float32(clf.std)
    captured = {}
    hooks = [torch_model.get_submodule(name).register_forward_hook(
        lambda _, __, out, name=name: captured.__setitem__(name, out.permute(0, 2, 3, 1).numpy().copy()))
        for name in layers]
    with torch.no_grad():
        logits = torch_model(torch.from_numpy(normalised.transpose(0, 3, 1, 2).copy())).numpy()
    for hook in hooks:
        hook.remove()

    features = jax.jit(lambda c, x: c.features(x))(clf, images)
    assert np.abs(logits).max() > 0.3  # a non-degenerate comparison
    # float32 through ~20 layers: differences are rounding (~1e-6 relative).
    np.testing.assert_allclose(features["logits"], logits, atol=1e-4, rtol=0)
    for name in layers:
        scale = np.abs(captured[name]).max()
        np.testing.assert_allclose(features[name], captured[name], atol=1e-5 * max(scale, 1.0), rtol=0,
                                   err_msg=name)


# Reduced configurations: every block kind (with and without expansion, residual or not,
# strided, squeeze-excitation or not, both activations), few blocks, 32x32 inputs.
V2_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 1, 2))
V3_SETTING = tuple(mobilenet_v3.LARGE_SETTING[i] for i in (0, 1, 3, 4, 6, 12))
EFFICIENTNET_STAGES = efficientnet.STAGES[:3]


def test_mobilenet_v2_parity_with_torchvision():
    torch_model = randomize(torchvision.models.mobilenet_v2(
        width_mult=0.5, num_classes=NUM_CLASSES, inverted_residual_setting=[list(s) for s in V2_SETTING]))
    module = mobilenet_v2.MobileNetV2(0.5, NUM_CLASSES, V2_SETTING, rngs=nnx.Rngs(params=jax.random.key(0)))
    clf = converted(module, mobilenet_v2.convert_mobilenet_v2, torch_model)
    assert_parity(clf, torch_model, ("features.0", "features.1.conv.0", "features.2", "features.3.conv.1.1",
                                     "features.4", "features.5"))


def test_mobilenet_v3_parity_with_robustart_definition():
    """At width 0.75 the first block has no expansion layer and the others have one."""
    width = 0.75
    torch_model = randomize(TorchMobileNetV3Large(width, NUM_CLASSES, V3_SETTING))
    module = mobilenet_v3.MobileNetV3Large(width, NUM_CLASSES, V3_SETTING, rngs=nnx.Rngs(params=jax.random.key(0)))
    clf = converted(module, mobilenet_v3.convert_mobilenet_v3, torch_model)
    assert_parity(clf, torch_model, ("features.0", "features.1", "features.3.conv.5", "features.4", "features.5",
                                     "features.6", "features.7", "features.9"))


def test_efficientnet_parity_with_torchvision():
    """With B5-B7's BatchNorm eps 1e-3, which changes activations by ~1e-3 if ignored."""
    from torchvision.models.efficientnet import EfficientNet, MBConvConfig

    setting = [MBConvConfig(*stage, width_mult=0.5, depth_mult=1.0) for stage in EFFICIENTNET_STAGES]
    torch_model = randomize(EfficientNet(setting, dropout=0.4, num_classes=NUM_CLASSES,
                                         norm_layer=functools.partial(nn.BatchNorm2d, eps=1e-3, momentum=0.01)))
    module = efficientnet.EfficientNet(0.5, 1.0, NUM_CLASSES, 0.4, bn_eps=1e-3, bn_momentum=0.01,
                                       stages=EFFICIENTNET_STAGES, rngs=nnx.Rngs(params=jax.random.key(0)))
    clf = converted(module, efficientnet.convert_efficientnet, torch_model)
    assert_parity(clf, torch_model, ("features.0", "features.1.0.block.1", "features.2.0", "features.2.1.block.0",
                                     "features.3", "features.4"))


def torch_count(model: "nn.Module") -> int:
    """Parameters plus BatchNorm running statistics (the classifier's leaves hold both)."""
    buffers = sum(b.numel() for name, b in model.named_buffers() if name.endswith(("running_mean", "running_var")))
    return sum(p.numel() for p in model.parameters()) + buffers


@pytest.mark.parametrize("name", MOBILENET_V2 + MOBILENET_V3 + EFFICIENTNET)
def test_full_size_model_matches_pytorch_and_its_card(name):
    """Parameter count (with BatchNorm statistics) equal to PyTorch's at full size and
    RobustART's rounded figure; BatchNorm eps; native input size; ImageNet normalisation."""
    with torch.device("meta"):
        torch_model = torch_full_size(name)
    entry = rj.zoo.get(name)
    abstract = build_abstract(entry.build)
    assert rj.zoo.count_params(abstract) == torch_count(torch_model)
    assert round(sum(p.numel() for p in torch_model.parameters()) / 1e6, 2) == ROBUSTART_MILLIONS[name]

    module = nnx.merge(abstract.apply_fn.graphdef, abstract.params)
    ours = {layer.epsilon for _, layer in nnx.iter_modules(module) if isinstance(layer, nnx.BatchNorm)}
    assert ours == {m.eps for m in torch_model.modules() if isinstance(m, nn.BatchNorm2d)}

    size = efficientnet.VARIANTS[name][2] if name in efficientnet.VARIANTS else 224
    assert abstract.input_shape == (size, size, 3)
    assert (abstract.mean, abstract.std) == (mobilenet_v2.IMAGENET_MEAN, mobilenet_v2.IMAGENET_STD)
    assert entry.convert is not None and entry.torch_source
    with pytest.raises(ValueError, match="no pretrained weights"):
        entry.build(key=jax.random.key(0), pretrained=True)


def test_input_size_and_class_count_overrides():
    resized = build_abstract(rj.zoo.get("efficientnet_b3").build, image_size=224, num_classes=7)
    assert (resized.input_shape, resized.num_classes) == ((224, 224, 3), 7)
    for name in ("mobilenet_v2_x1_0", "mobilenet_v3_large_x1_0", "efficientnet_b0"):
        with pytest.raises(ValueError, match="image_size must be an integer"):
            rj.zoo.get(name).build(key=jax.random.key(0), image_size=0)
        with pytest.raises(ValueError, match="num_classes must be an integer"):
            rj.zoo.get(name).build(key=jax.random.key(0), num_classes=2.5)


def test_from_torch_names_each_bad_tensor():
    state = {k: v.numpy() for k, v in torchvision.models.mobilenet_v2(width_mult=0.5).state_dict().items()}
    assert from_torch("mobilenet_v2_x0_5", state).name == "mobilenet_v2_x0_5"

    broken = dict(state)
    del broken["features.3.conv.1.1.running_var"]
    broken["extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"missing features\.3\.conv\.1\.1\.running_var.*unexpected extra\.weight"):
        from_torch("mobilenet_v2_x0_5", broken)

    reshaped = dict(state, **{"features.2.conv.2.weight": np.zeros((17, 48, 1, 1), np.float32)})
    with pytest.raises(ValueError, match=r"features\.2\.conv\.2\.kernel has shape \(1, 1, 48, 17\)"):
        from_torch("mobilenet_v2_x0_5", reshaped)
