"""ViT / DeiT, MLP-Mixer and Swin ports against timm 1.0: logits and intermediate activations
of reduced-size models with converted random weights, full-size parameter counts, and
errors for state dicts that do not fit."""

import jax
import numpy as np
import pytest

import robustjax as rj
from robustjax.zoo import mixer, swin, vit  # noqa: F401  (registers the models)
from robustjax.zoo.abstract import build_abstract
from robustjax.zoo.convert import TorchWeights, from_torch
from tests.helpers import count_compiles

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

FAMILIES = ("vit", "deit", "mlp_mixer", "swin")
NAMES = [name for name in rj.zoo.names() if rj.zoo.get(name).family in FAMILIES]

from timm.models.mlp_mixer import MlpMixer  # noqa: E402
from timm.models.swin_transformer import SwinTransformer  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

# (zoo name, timm class, reduced config, hooked layers). The second Swin config pads windows
# (grid 15 -> 20 and 8 -> 10 for window 5), pads an odd grid before patch merging (15 -> 16)
# and clamps the last stage's window to its 4x4 grid.
CASES = {
    "vit": ("vit_base_patch16_224", VisionTransformer,
            dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3),
            ("patch_embed.proj", "patch_embed", "blocks.0.attn", "blocks.1", "norm")),
    "mixer": ("mixer_b16_224", MlpMixer,
              dict(img_size=32, patch_size=8, embed_dim=48, num_blocks=2),
              ("stem", "blocks.0.mlp_tokens", "blocks.0", "blocks.1", "norm")),
    "swin": ("swin_tiny_patch4_window7_224", SwinTransformer,
             dict(img_size=56, patch_size=4, window_size=7, embed_dim=24, depths=(2, 2),
                  num_heads=(1, 2)),
             ("patch_embed", "layers.0.blocks.0", "layers.0.blocks.1.attn", "layers.0.blocks.1",
              "layers.1.downsample", "layers.1.blocks.1", "norm")),
    "swin_padded": ("swin_tiny_patch4_window7_224", SwinTransformer,
                    dict(img_size=60, patch_size=4, window_size=5, embed_dim=16, depths=(2, 2, 2),
                         num_heads=(1, 2, 4)),
                    ("layers.0.blocks.1.attn", "layers.0.blocks.1", "layers.1.downsample",
                     "layers.1.blocks.1", "layers.2.blocks.1", "norm")),
}
NCHW_LAYERS = {"patch_embed.proj"}  # torch convolution outputs, compared as NHWC


def randomised(model):
    """Eval-mode ``model`` with every parameter moved off timm's init (LayerNorm scales of 1
    and biases of 0 would hide a swapped scale/bias)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def numpy_state(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def abstract(name: str, **kwargs) -> rj.Classifier:
    """The classifier with shape-only parameters: built without running the initialisers,
    which would compile once per parameter shape for weights about to be replaced."""
    return build_abstract(rj.zoo.get(name).build, **kwargs)


forward = jax.jit(lambda clf, x: clf(x))
features = jax.jit(lambda clf, x: clf.features(x))


def torch_forward(model, clf: rj.Classifier, images: np.ndarray, layers=()):
    """timm's logits and the outputs of ``layers`` (NCHW ones moved to NHWC) for [0, 1]
    images normalised with the classifier's mean/std."""
    captured = {}

    def hook(name):
        def record(_, __, out):
            captured[name] = (out.permute(0, 2, 3, 1) if name in NCHW_LAYERS else out).numpy()
        return record

    hooks = [model.get_submodule(name).register_forward_hook(hook(name)) for name in layers]
    normalised = (images - np.asarray(clf.mean, np.float32)) / np.asarray(clf.std, np.float32)
    with torch.no_grad():
        logits = model(torch.from_numpy(normalised.transpose(0, 3, 1, 2).copy())).numpy()
    for handle in hooks:
        handle.remove()
    return logits, captured


def images_for(size: int, batch: int = 2) -> np.ndarray:
    return np.random.default_rng(1).uniform(size=(batch, size, size, 3)).astype(np.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_activations_match_timm(case):
    name, torch_class, config, layers = CASES[case]
    model = randomised(torch_class(num_classes=10, **config))
    clf = from_torch(name, numpy_state(model), num_classes=10, **config)
    images = images_for(config["img_size"])

    logits, captured = torch_forward(model, clf, images, layers)
    ours = features(clf, images)
    assert np.abs(logits).max() > 0.1  # a non-degenerate comparison
    # float32 reference and port differ only in summation order: ~1e-6 observed on logits of
    # magnitude ~1, so 1e-4 leaves a wide margin yet catches any layout or epsilon mistake.
    np.testing.assert_allclose(ours["logits"], logits, atol=1e-4, rtol=0)
    for layer, expected in captured.items():
        scale = max(float(np.abs(expected).max()), 1.0)
        np.testing.assert_allclose(ours[layer], expected, atol=1e-5 * scale, rtol=0, err_msg=layer)


def test_vit_representation_layer_matches_a_pre_logits_model():
    """``representation_size`` adds ``tanh(pre_logits.fc(x))`` before the head, as the
    original ViT; the reference is timm's ViT with its head as ``pre_logits.fc``, then tanh
    and a second linear layer."""
    config = CASES["vit"][2]
    body = randomised(VisionTransformer(num_classes=20, **config))
    head = randomised(torch.nn.Linear(20, 10))
    state = {(k.replace("head.", "pre_logits.fc.") if k.startswith("head.") else k): v
             for k, v in numpy_state(body).items()}
    state.update({f"head.{k}": v for k, v in numpy_state(head).items()})
    clf = from_torch("vit_base_patch16_224", state, num_classes=10, representation_size=20, **config)
    images = images_for(config["img_size"])
    normalised = (images - 0.5) / 0.5
    with torch.no_grad():
        pooled = body(torch.from_numpy(normalised.transpose(0, 3, 1, 2).copy()))
        logits = head(torch.tanh(pooled)).numpy()
    assert np.abs(logits).max() > 0.1
    np.testing.assert_allclose(forward(clf, images), logits, atol=1e-4, rtol=0)  # as above


def test_full_size_deit_tiny_through_from_torch():
    """The registered full-size model, converted by ``from_torch``, at 224x224."""
    model = randomised(timm.create_model("deit_tiny_patch16_224", pretrained=False, num_classes=10))
    clf = from_torch("deit_tiny_patch16_224", numpy_state(model), num_classes=10)
    images = images_for(224, batch=1)
    logits, _ = torch_forward(model, clf, images)
    assert np.abs(logits).max() > 0.1
    np.testing.assert_allclose(forward(clf, images), logits, atol=1e-4, rtol=0)  # as above


def parameter_count(clf: rj.Classifier) -> int:
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(clf.params))


@pytest.mark.parametrize("name", NAMES)
def test_full_size_parameter_count_equals_timm(name):
    """Counted without allocating on either side. timm's Swin also holds buffers (the
    relative position index and the shift masks), derived from sizes and not counted."""
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False)
    assert parameter_count(abstract(name)) == sum(p.numel() for p in model.parameters())


def test_robustart_vit_has_a_768_wide_representation_layer():
    # RobustART's ViT-B/16 (87.16M) = timm's (86.57M) + a 768x768 pre-logits layer with bias.
    clf = abstract("vit_base_patch16_224", representation_size=768)
    assert parameter_count(clf) == 86_567_656 + 768 * 768 + 768


def test_registered_names_cards_and_normalisation():
    assert set(NAMES) == {
        "vit_base_patch16_224", "vit_base_patch32_224", "deit_tiny_patch16_224",
        "deit_small_patch16_224", "deit_base_patch16_224", "mixer_b16_224", "mixer_l16_224",
        "swin_tiny_patch4_window7_224",
        "swin_small_patch4_window7_224", "swin_base_patch4_window7_224"}
    for name in NAMES:
        entry = rj.zoo.get(name)
        assert entry.weights is None and entry.torch_source == f"timm:{name}"
        cfg = timm.models.get_pretrained_cfg(name)
        clf = abstract(name, num_classes=10, **SMALL[entry.family])
        assert (clf.mean, clf.std, clf.num_classes) == (tuple(cfg.mean), tuple(cfg.std), 10), name
        assert clf.input_shape == (SMALL[entry.family]["img_size"],) * 2 + (3,)
        with pytest.raises(ValueError, match="no pretrained weights"):
            rj.zoo.create(name)


SMALL = {"vit": CASES["vit"][2], "deit": CASES["vit"][2], "mlp_mixer": CASES["mixer"][2],
         "swin": CASES["swin"][2]}


@pytest.mark.parametrize(("name", "kwargs", "message"), [
    ("vit_base_patch16_224", dict(img_size=30, patch_size=8), "multiple of patch_size"),
    ("deit_tiny_patch16_224", dict(embed_dim=50, num_heads=3), "divisible by num_heads"),
    ("mixer_b16_224", dict(num_blocks=0), "num_blocks"),
    ("swin_tiny_patch4_window7_224", dict(depths=(2, 2), num_heads=(3,)), "equal length"),
    ("swin_tiny_patch4_window7_224", dict(embed_dim=24, depths=(2, 2), num_heads=(5, 2)),
     "stage 0 width"),
    ("vit_base_patch16_224", dict(num_classes=1), "num_classes"),
])
def test_bad_configs_are_rejected(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        rj.zoo.create(name, pretrained=False, **kwargs)


def test_unknown_argument_is_rejected():
    with pytest.raises(TypeError, match="depths"):
        rj.zoo.create("vit_base_patch16_224", pretrained=False, depths=(2, 2))


@pytest.fixture(scope="module")
def small_vit():
    config = CASES["vit"][2]
    model = randomised(VisionTransformer(num_classes=10, **config))
    return config, numpy_state(model)


def test_missing_and_unexpected_tensors_are_named(small_vit):
    config, state = small_vit
    state = dict(state)
    del state["blocks.1.attn.qkv.bias"]
    state["blocks.0.attn.gate.weight"] = np.zeros((3,), np.float32)
    names = "missing blocks.1.attn.qkv.bias.*unexpected blocks.0.attn.gate.weight"
    with pytest.raises(ValueError, match=names):
        from_torch("vit_base_patch16_224", state, num_classes=10, **config)


def test_wrongly_shaped_tensor_is_named(small_vit):
    config, state = small_vit
    state = dict(state, **{"blocks.0.mlp.fc1.weight": np.zeros((100, 48), np.float32)})
    message = r"blocks.0.mlp.fc1.kernel has shape \(48, 100\), expected \(48, 192\)"
    with pytest.raises(ValueError, match=message):
        from_torch("vit_base_patch16_224", state, num_classes=10, **config)


def test_a_missing_block_is_named_through_from_torch():
    with torch.device("meta"):
        model = timm.create_model("deit_tiny_patch16_224", pretrained=False, depth=11)
    state = {k: np.zeros(v.shape, np.float32) for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="missing blocks.11.norm1.scale"):
        from_torch("deit_tiny_patch16_224", state)


def test_swin_accepts_the_derived_buffers_of_older_checkpoints():
    torch_class, config = CASES["swin"][1:3]
    model = randomised(torch_class(num_classes=10, **config))
    state = numpy_state(model)  # timm 1.0 keeps both buffers out of the state dict
    old = dict(state)
    for path, module in model.named_modules():
        if isinstance(module, timm.models.swin_transformer.WindowAttention):
            old[f"{path}.relative_position_index"] = module.relative_position_index.numpy()
        if getattr(module, "attn_mask", None) is not None:  # the shifted blocks
            old[f"{path}.attn_mask"] = module.attn_mask.numpy()
    assert any(k.endswith("attn_mask") for k in old)
    convert = rj.zoo.get("swin_tiny_patch4_window7_224").convert
    expected, weights = convert(TorchWeights(state)), TorchWeights(old)
    converted = convert(weights)
    weights.check_all_used()
    jax.tree.map(np.testing.assert_array_equal, converted, expected)

    old["layers.0.blocks.0.attn.relative_position_index"] = np.zeros((49, 49), np.int64)
    with pytest.raises(ValueError, match="layers.0.blocks.0.attn.relative_position_index"):
        convert(TorchWeights(old))


def test_swin_relative_position_index_and_mask_equal_timms():
    from timm.models.swin_transformer import SwinTransformerBlock, get_relative_position_index

    expected = get_relative_position_index(7, 7).numpy()
    np.testing.assert_array_equal(swin.relative_position_index(7), expected)
    block = SwinTransformerBlock(dim=8, input_resolution=(14, 14), num_heads=1, window_size=7,
                                 shift_size=3)
    np.testing.assert_array_equal(swin.shifted_window_mask(14, 14, 7, 3), block.attn_mask.numpy())


def test_swin_jit_compiles_once():
    config = CASES["swin"][2]
    clf = jax.tree.map(lambda s: np.full(s.shape, 0.01, s.dtype),
                       abstract("swin_tiny_patch4_window7_224", num_classes=10, **config))
    images = images_for(config["img_size"])
    assert forward(clf, images).shape == (2, 10)
    with count_compiles() as compiles:
        forward(clf, images * 0.5).block_until_ready()
    assert compiles[0] == 0
