"""DenseNet, RegNetX, RepVGG and ShuffleNetV2 ports: parity with torchvision / timm models
(logits and intermediate activations, reduced sizes), full-size parameter counts, the
RepVGG re-parameterisation, and errors for state dicts that do not fit."""

import re

import jax
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax.zoo import densenet, regnet, repvgg, shufflenet  # noqa: F401  (registers the models)
from robustjax.zoo.abstract import build_abstract
from robustjax.zoo.convert import TorchWeights, from_torch

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
timm = pytest.importorskip("timm")

MEAN = np.array(densenet.IMAGENET_MEAN, np.float32)
STD = np.array(densenet.IMAGENET_STD, np.float32)
# Float32 logits of these depths agree to ~1e-6 relative; 1e-4 absolute leaves room for
# summation-order differences between XLA and PyTorch convolutions (logits are O(1)).
LOGIT_ATOL = 1e-4
# Parameter counts (millions, training-time form, running statistics excluded) from the
# RobustART table (reference/robustart.md, section 2.1).
ROBUSTART_PARAMS_M = {
    "densenet121": 7.98, "densenet169": 14.15, "densenet201": 20.01,
    "regnetx_400m": 5.16, "regnetx_800m": 7.26, "regnetx_1600m": 9.19, "regnetx_3200m": 15.3,
    "regnetx_6400m": 26.21, "repvgg_a0": 9.11, "repvgg_b3": 123.09, "shufflenet_v2_x0_5": 1.37,
    "shufflenet_v2_x1_0": 2.28, "shufflenet_v2_x1_5": 3.5, "shufflenet_v2_x2_0": 7.39,
}


def torch_model(name: str):
    """The full-size PyTorch reference of a registered model (``torch_source``)."""
    source = rj.zoo.get(name).torch_source
    if source.startswith("timm:"):
        return timm.create_model(source[len("timm:"):], pretrained=False)
    return getattr(torchvision.models, source.rsplit(".", 1)[1])()


@pytest.fixture(autouse=True)
def seeded_torch():
    """PyTorch models initialise from the global generator: seed it for repeatable tests."""
    torch.manual_seed(0)


def randomize(model, seed: int = 0):
    """Eval mode, with non-trivial BatchNorm statistics, scales and biases, and a classifier
    of unit-variance weights so that logits are O(1) (not O(0.1)) and the comparison bites."""
    gen = torch.Generator().manual_seed(seed)
    for layer in model.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.weight.data.copy_(torch.randn(layer.weight.shape, generator=gen)
                                    / layer.in_features ** 0.5)
        if isinstance(layer, torch.nn.BatchNorm2d):
            shape = layer.running_mean.shape
            layer.running_mean.copy_(torch.randn(shape, generator=gen) * 0.2)
            layer.running_var.copy_(torch.rand(shape, generator=gen) + 0.5)
            layer.weight.data.copy_(torch.rand(shape, generator=gen) + 0.5)
            layer.bias.data.copy_(torch.randn(shape, generator=gen) * 0.1)
    return model.eval()


def state_dict(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def load(name: str, tensors: dict[str, np.ndarray], **build_kwargs) -> rj.Classifier:
    """``from_torch`` for a reduced model built with ``build_kwargs``."""
    return from_torch(name, tensors, source="test state dict", **build_kwargs)


def converted(name: str, tensors: dict[str, np.ndarray]) -> dict:
    """The converter's parameter tree, every tensor used."""
    weights = TorchWeights(tensors, "test state dict")
    params = rj.zoo.get(name).convert(weights)
    weights.check_all_used()
    return params


def assert_same_tree(a: dict, b: dict, atol: float = 0.0):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=atol, rtol=0), a, b)


def logits_and_features(clf: rj.Classifier, images: np.ndarray) -> tuple[np.ndarray, dict]:
    """One compiled call: the features include the logits (``"logits"``)."""
    features = jax.jit(lambda c, x: c.features(x))(clf, images)
    return np.asarray(features["logits"]), features


def torch_run(model, images: np.ndarray, layers: dict[str, str]):
    """Logits and NHWC activations of ``model`` (torch layer -> our layer names in ``layers``)."""
    x = torch.from_numpy(((images - MEAN) / STD).transpose(0, 3, 1, 2).copy())
    captured = {}

    def hook(ours):  # clone: later in-place ReLUs would overwrite the output
        def record(_, __, out):
            captured[ours] = out.detach().clone().permute(0, 2, 3, 1).numpy()
        return record

    hooks = [model.get_submodule(theirs).register_forward_hook(hook(ours))
             for theirs, ours in layers.items()]
    with torch.no_grad():
        logits = model(x).numpy()
    for handle in hooks:
        handle.remove()
    return logits, captured


def assert_parity(clf: rj.Classifier, model, images: np.ndarray, layers: dict[str, str]):
    logits, activations = torch_run(model, images, layers)
    assert np.abs(logits).max() > 0.1  # a non-degenerate comparison
    ours, features = logits_and_features(clf, images)
    np.testing.assert_allclose(ours, logits, atol=LOGIT_ATOL, rtol=0)
    for name, expected in activations.items():
        # activations grow with depth; 1e-5 relative to the layer's largest value
        scale = max(float(np.abs(expected).max()), 1.0)
        np.testing.assert_allclose(features[name], expected, atol=1e-5 * scale, rtol=0, err_msg=name)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(1).uniform(size=(2, 64, 64, 3)).astype(np.float32)


# --- parity ------------------------------------------------------------------------------

DENSENET_SMALL = dict(growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16, bn_size=2)


@pytest.fixture(scope="module")
def small_densenet():
    return randomize(torchvision.models.DenseNet(num_classes=10, **DENSENET_SMALL))


def test_densenet_parity(small_densenet, images):
    clf = load("densenet121", state_dict(small_densenet), num_classes=10, **DENSENET_SMALL)
    layers = {name: name for name in ("features.conv0", "features.denseblock1", "features.transition2",
                                      "features.denseblock4.denselayer2", "features.norm5")}
    assert_parity(clf, small_densenet, images, layers)


def test_densenet_reads_legacy_keys(small_densenet):
    """Checkpoints from before torchvision 0.3 name ``norm1`` as ``norm.1``."""
    tensors = state_dict(small_densenet)
    pattern = r"(denselayer\d+\.(?:norm|conv))([12])\."
    legacy = {re.sub(pattern, r"\1.\2.", k): v for k, v in tensors.items()}
    assert "features.denseblock1.denselayer1.norm.1.weight" in legacy
    assert_same_tree(converted("densenet121", legacy), converted("densenet121", tensors))


def test_regnet_parity(images):
    small = dict(depth=6, w0=8, wa=8.0, wm=2.0, group_size=8, stem_width=16)
    model = randomize(timm.models.regnet.RegNet(timm.models.regnet.RegNetCfg(**small), num_classes=10))
    clf = load("regnetx_400m", state_dict(model), num_classes=10, **small)
    assert [w for w, _, _ in regnet.stage_plan(regnet.RegNetConfig(**small))] == [8, 16, 32, 64]
    names = ("stem", "s1.b1", "s2.b1.conv2", "s3.b1.downsample", "s3.b3", "s4")
    layers = {name: name for name in names}
    assert_parity(clf, model, images, layers)


@pytest.mark.parametrize("name", list(regnet.CONFIGS))
def test_regnet_stage_plan_matches_timm(name):
    with torch.device("meta"):
        model = torch_model(name)
    stages = [getattr(model, f"s{i}") for i in range(1, 5)]
    expected = [(s.b1.conv1.conv.out_channels, len(list(s.children())),
                 s.b1.conv2.conv.out_channels // s.b1.conv2.conv.groups) for s in stages]
    assert regnet.stage_plan(regnet.CONFIGS[name][1]) == expected


REPVGG_SMALL = dict(num_blocks=(1, 2, 1, 1), widths=(16, 16, 32, 64, 256))
# timm's layout -> ours (the official one)
REPVGG_LAYERS = {"stem": "stage0", "stages.0.0": "stage1.0",
                 "stages.1.1.conv_kxk": "stage2.1.rbr_dense",
                 "stages.1.1.identity": "stage2.1.rbr_identity",
                 "stages.2.0.conv_1x1": "stage3.0.rbr_1x1", "stages.3.0": "stage4.0"}


@pytest.fixture(scope="module")
def small_repvgg():
    from timm.models.byobnet import ByobNet, ByoModelCfg, _rep_vgg_bcfg

    cfg = ByoModelCfg(blocks=_rep_vgg_bcfg(d=(1, 2, 1, 1), wf=(0.25, 0.25, 0.25, 0.5)), stem_type="rep",
                      stem_chs=16)
    return randomize(ByobNet(cfg, num_classes=10))


def test_repvgg_parity(small_repvgg, images):
    clf = load("repvgg_a0", state_dict(small_repvgg), num_classes=10, **REPVGG_SMALL)
    assert_parity(clf, small_repvgg, images, REPVGG_LAYERS)


def official_layout(key: str) -> str:
    """A timm RepVGG key in DingXiaoH/RepVGG's names (the layout RobustART trained)."""
    key = re.sub(r"^stages\.(\d+)\.", lambda m: f"stage{int(m[1]) + 1}.", key)
    key = re.sub(r"^stem\.", "stage0.", key).replace("head.fc.", "linear.")
    return key.replace("conv_kxk", "rbr_dense").replace("conv_1x1", "rbr_1x1").replace(
        "identity", "rbr_identity").replace("reparam_conv", "rbr_reparam")


def test_repvgg_reads_the_official_layout(small_repvgg):
    tensors = state_dict(small_repvgg)
    official = {official_layout(k): v for k, v in tensors.items()}
    assert "stage2.1.rbr_identity.running_var" in official and "linear.weight" in official
    assert_same_tree(converted("repvgg_a0", official), converted("repvgg_a0", tensors))


def test_repvgg_reparameterize(small_repvgg, images):
    """Fused blocks give the training-time logits, and equal timm's own re-parameterisation."""
    clf = load("repvgg_a0", state_dict(small_repvgg), num_classes=10, **REPVGG_SMALL)
    deploy = repvgg.reparameterize(clf)
    assert deploy.name == "repvgg_a0_deploy"
    assert "rbr_reparam" in nnx.to_pure_dict(deploy.params)["stage2"][1]
    train_logits, train_features = logits_and_features(clf, images)
    deploy_logits, deploy_features = logits_and_features(deploy, images)
    # the fused kernels sum three branches in a different order: float32 rounding only
    np.testing.assert_allclose(deploy_logits, train_logits, atol=1e-4, rtol=0)
    for name in ("stage0", "stage2.1", "stage4.0"):
        np.testing.assert_allclose(deploy_features[name], train_features[name], atol=1e-4, rtol=0,
                                   err_msg=name)

    from timm.utils.model import reparameterize_model

    fused_torch = state_dict(reparameterize_model(small_repvgg))
    ours = jax.tree.map(np.asarray, nnx.to_pure_dict(deploy.params))
    for tensors in (fused_torch, {official_layout(k): v for k, v in fused_torch.items()}):
        # same algebra in float32: kernels and biases are O(1)
        assert_same_tree(converted("repvgg_a0_deploy", tensors), ours, atol=1e-5)
    with pytest.raises(ValueError, match="not a training-time RepVGG"):
        repvgg.reparameterize(deploy)


def test_shufflenet_parity_full_architecture(images):
    """x0.5 at full depth and width (1.4M parameters) through ``from_torch``."""
    model = randomize(torchvision.models.shufflenet_v2_x0_5(num_classes=10))
    clf = from_torch("shufflenet_v2_x0_5", state_dict(model), num_classes=10)
    layers = {"conv1.1": "conv1.1", "stage2.0": "stage2.0", "stage2.1.branch2.3": "stage2.1.branch2.3",
              "stage3.0.branch1.4": "stage3.0.branch1.4", "stage4.3": "stage4.3", "conv5": "conv5.2"}
    assert_parity(clf, model, images, layers)


def test_channel_shuffle_matches_torchvision():
    from torchvision.models.shufflenetv2 import channel_shuffle

    x = np.random.default_rng(0).normal(size=(1, 2, 3, 12)).astype(np.float32)
    expected = channel_shuffle(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()), 2)
    expected = expected.permute(0, 2, 3, 1).numpy()
    np.testing.assert_array_equal(np.asarray(shufflenet.channel_shuffle(x, 2)), expected)


# --- full-size parameter counts -------------------------------------------------------------

@pytest.mark.parametrize("name", list(ROBUSTART_PARAMS_M))
def test_full_size_parameter_counts(name):
    with torch.device("meta"):
        model = torch_model(name)
    n_params = sum(p.numel() for p in model.parameters())
    n_stats = sum(b.numel() for k, b in model.named_buffers()
                  if k.endswith(("running_mean", "running_var")))
    abstract = build_abstract(rj.zoo.get(name).build)
    assert rj.zoo.count_params(abstract) == n_params + n_stats
    assert round(n_params / 1e6, 2) == ROBUSTART_PARAMS_M[name]


# --- registry and errors --------------------------------------------------------------------

@pytest.mark.parametrize(
    "name", ["densenet121", "regnetx_3200m", "repvgg_b3_deploy", "shufflenet_v2_x2_0"])
def test_registered_without_pretrained_weights(name):
    entry = rj.zoo.get(name)
    assert entry.convert is not None and entry.torch_source
    with pytest.raises(ValueError, match="no pretrained weights"):
        entry.build(key=jax.random.key(0), pretrained=True)


def test_builders_reject_bad_sizes():
    with pytest.raises(ValueError, match="block_config"):
        rj.zoo.get("densenet121").build(key=jax.random.key(0), block_config=(2, 0))
    with pytest.raises(ValueError, match="w0"):
        rj.zoo.get("regnetx_400m").build(key=jax.random.key(0), w0=12)
    with pytest.raises(TypeError, match="unknown regnetx_400m arguments"):
        rj.zoo.get("regnetx_400m").build(key=jax.random.key(0), widht=3)
    with pytest.raises(ValueError, match="num_blocks"):
        rj.zoo.get("repvgg_a0").build(key=jax.random.key(0), num_blocks=(1, 1))
    with pytest.raises(ValueError, match="stages_repeats"):
        rj.zoo.get("shufflenet_v2_x0_5").build(key=jax.random.key(0), stages_repeats=(1, 1))


@pytest.fixture(scope="module")
def shufflenet_tensors() -> dict[str, np.ndarray]:
    return state_dict(torchvision.models.shufflenet_v2_x0_5())


def test_wrong_state_dict_names_each_problem(shufflenet_tensors):
    tensors = dict(shufflenet_tensors)
    del tensors["stage3.2.branch2.4.running_var"]
    tensors["stage3.2.branch2.9.weight"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"missing stage3\.2\.branch2\.4\.running_var.*"
                                         r"unexpected stage3\.2\.branch2\.9\.weight \(3,\)"):
        from_torch("shufflenet_v2_x0_5", tensors)

    tensors = dict(shufflenet_tensors)
    tensors["conv5.0.weight"] = np.zeros((1024, 96, 1, 1), np.float32)
    expected = r"conv5\.0\.kernel has shape \(1, 1, 96, 1024\), expected \(1, 1, 192, 1024\)"
    with pytest.raises(ValueError, match=expected):
        from_torch("shufflenet_v2_x0_5", tensors)


@pytest.mark.parametrize("name", ["densenet121", "regnetx_400m", "repvgg_a0"])
def test_other_families_name_a_missing_and_an_extra_tensor(name, small_densenet, small_repvgg):
    small = {"densenet121": (small_densenet, DENSENET_SMALL),
             "regnetx_400m": (timm.models.regnet.RegNet(timm.models.regnet.RegNetCfg(
                 depth=6, w0=8, wa=8.0, wm=2.0, group_size=8, stem_width=16), num_classes=10),
                 dict(depth=6, w0=8, wa=8.0, wm=2.0, group_size=8, stem_width=16)),
             "repvgg_a0": (small_repvgg, REPVGG_SMALL)}
    model, kwargs = small[name]
    tensors = state_dict(model)
    dropped = sorted(k for k in tensors if k.endswith("running_mean"))[3]
    del tensors[dropped]
    tensors["extra.weight"] = np.zeros((2, 2), np.float32)
    expected = rf"missing {re.escape(dropped)}.*unexpected extra\.weight \(2, 2\)"
    with pytest.raises(ValueError, match=expected):
        load(name, tensors, num_classes=10, **kwargs)
