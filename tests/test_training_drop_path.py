"""Drop-path / stochastic depth (issue 21): the layer's closed form, the per-block rates of
timm's (and torchvision's EfficientNet) rule, a training step of a tiny ViT with it, and the
refusal of models without it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax import training
from robustjax.training.model import TrainModel
from robustjax.training.step import init_state, make_step
from robustjax.zoo.abstract import build_abstract
from robustjax.zoo.drop_path import DropPath

TINY = {"vit_base_patch16_224": dict(img_size=16, patch_size=8, embed_dim=12, depth=3, num_heads=3),
        "mixer_b16_224": dict(img_size=16, patch_size=8, embed_dim=12, num_blocks=2),
        "swin_tiny_patch4_window7_224": dict(img_size=16, patch_size=4, window_size=2, embed_dim=6, depths=(2, 2),
                                             num_heads=(1, 2))}


def test_drop_path_zeroes_a_fraction_p_of_examples_and_rescales_the_rest():
    """At rate p, an example's branch is 0 with probability p, else x / (1 - p); the layer's
    rate is the network's times its scale; identity when inactive."""
    layer = DropPath(0.5)
    x = jnp.ones((20_000, 3, 2))
    assert layer(x) is x  # built inactive
    active = nnx.view(layer, drop_path_rate=0.6)
    assert active.rate == pytest.approx(0.3)
    active.rngs = nnx.Rngs(dropout=0)["dropout"]
    out = np.asarray(active(x)).reshape(20_000, -1)
    per_example = out[:, 0]
    assert np.all(out == per_example[:, None])  # one draw per example
    assert set(np.unique(per_example)) == {0.0, np.float32(1 / 0.7)}
    assert abs(np.mean(per_example == 0) - 0.3) < 0.015  # 4.6 binomial standard deviations
    assert nnx.view(active, drop_path_rate=0.0)(x) is x


def _rates(clf: rj.Classifier, rate: float) -> list[float]:
    model = TrainModel.from_classifier(clf, drop_path=rate)
    module = nnx.merge(model.train_graphdef, clf.params)
    return [m.rate for _, m in nnx.iter_modules(module) if isinstance(m, DropPath)]


def test_block_rates_follow_timm_and_torchvision():
    timm = pytest.importorskip("timm")
    models = pytest.importorskip("torchvision.models.efficientnet")
    for name, config in TINY.items():
        ours = _rates(build_abstract(rj.zoo.get(name).build, num_classes=3, **config), 0.1)
        arch = {"vit_base_patch16_224": timm.models.vision_transformer.VisionTransformer,
                "mixer_b16_224": timm.models.mlp_mixer.MlpMixer,
                "swin_tiny_patch4_window7_224": timm.models.swin_transformer.SwinTransformer}[name]
        reference = arch(num_classes=3, drop_path_rate=0.1, **config)
        # timm leaves a rate-0 layer out (nn.Identity); its Mixer calls one layer for both branches
        branches = 2 if name == "mixer_b16_224" else 1
        theirs = [getattr(m, "drop_prob", 0.0) for n, m in reference.named_modules() if "drop_path" in n
                  for _ in range(branches)]
        np.testing.assert_allclose(ours, theirs, atol=1e-7, err_msg=name)
    with pytest.importorskip("torch").device("meta"):
        reference = models.efficientnet_b0(stochastic_depth_prob=0.2)
    theirs = [b.stochastic_depth.p for b in reference.modules() if isinstance(b, models.MBConv) and b.use_res_connect]
    np.testing.assert_allclose(_rates(build_abstract(rj.zoo.get("efficientnet_b0").build), 0.2), theirs,
                               atol=1e-7)


def test_tiny_vit_trains_a_step_with_drop_path():
    """One step of the aligned recipe with drop_path trains (finite loss, moved weights);
    training-mode logits depend on the key, the trained network's evaluation does not."""
    name = "vit_base_patch16_224"
    clf = rj.zoo.create(name, pretrained=False, num_classes=3, **TINY[name])
    techniques = training.techniques.create("drop_path")
    assert training.aligned(rj.zoo.get(name).family, techniques).drop_path_rate == 0.1
    recipe = training.aligned(rj.zoo.get(name).family, techniques, drop_path_rate=0.5, steps=2, batch_size=8,
                              ema_decay=None, augment="none")
    model = TrainModel.from_classifier(clf, drop_path=recipe.drop_path_rate)
    optimizer, step = make_step(model, recipe, techniques, 8)
    x = jax.random.uniform(jax.random.key(1), (8, 16, 16, 3))
    state, metrics = step(init_state(model, optimizer, recipe), x, jnp.arange(8) % 3, jax.random.key(0))
    assert np.isfinite(float(metrics["loss"]))
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), state.params, model.split(clf.params)[0])
    assert max(jax.tree.leaves(moved)) > 0
    logits = jax.jit(lambda key: model.train_logits(*model.split(clf.params), clf.normalize(x), key)[0])
    assert float(jnp.abs(logits(jax.random.key(1)) - logits(jax.random.key(2))).max()) > 1e-4
    trained = model.eval_classifier(model.join(state.params, state.stats, state.other))
    np.testing.assert_array_equal(trained(x), trained(x))


def test_models_without_drop_path_are_refused(tmp_path):
    digits = rj.zoo.create("digits_cnn", pretrained=False)
    with pytest.raises(ValueError, match="'drop_path' needs drop-path .* digits_cnn has none"):
        TrainModel.from_classifier(digits, drop_path=0.1)
    techniques = training.techniques.create("drop_path")
    with pytest.raises(ValueError, match="'drop_path' needs drop-path"):
        training.train(digits, rj.data.digits("train"), tmp_path, training.aligned("digits_cnn", techniques),
                       techniques)
    vit = build_abstract(rj.zoo.get("vit_base_patch16_224").build, num_classes=3, **TINY["vit_base_patch16_224"])
    with pytest.raises(ValueError, match="'drop_path' and a recipe drop_path_rate > 0 go together"):
        make_step(TrainModel.from_classifier(vit), training.Recipe(), techniques, 8)
    with pytest.raises(ValueError, match=r"drop_path_rate must lie in \[0, 1\)"):
        training.Recipe(drop_path_rate=1.0)
    from robustjax.cli import main

    assert main(["train", "--technique", "drop_path", "--steps", "1", "--out", str(tmp_path / "cli"), "--quiet"]) == 2
