"""NAS networks: parity with the PyTorch originals (xautodl's NAS-Bench-201 TinyNetwork,
RobustART's BigNAS ResNets), and subnets cut from a supernet equal the same subnet run through it."""

import dataclasses

import jax
import numpy as np
import pytest

import robustjax as rj
from robustjax.nas.bignas import BigNASSpace
from tests.helpers import count_compiles, randomize_nnx_batch_norm

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from tests.zoo_parity import randomize, state_dict


@pytest.mark.parametrize("space", ["nb201_digits", "bignas_resnet_basic_digits"])
def test_a_bundled_supernet_loads_without_compiling_an_initialisation(space):
    """Its module is built with shapes only and every array comes from the stored weights
    (a random initialisation took 13-19 s to compile and throw away)."""
    jax.clear_caches()
    with count_compiles() as compiles:
        supernet = rj.nas.bundled_supernet(space)
    assert compiles[0] == 0
    assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(supernet.state))


def torch_logits(model, images: np.ndarray) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(images.transpose(0, 3, 1, 2).copy()))
    return (out[1] if isinstance(out, tuple) else out).numpy()


@pytest.mark.parametrize("arch", [
    11472,  # the ResNet cell
    "|skip_connect~0|+|avg_pool_3x3~0|none~1|+|none~0|skip_connect~1|avg_pool_3x3~2|",  # cells with no weights
    "|nor_conv_1x1~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|nor_conv_1x1~0|nor_conv_3x3~1|skip_connect~2|",
])
def test_nb201_network_matches_xautodl(arch):
    tiny_network = pytest.importorskip("xautodl.models.cell_infers.tiny_network")
    genotypes = pytest.importorskip("xautodl.models.cell_searchs.genotypes")
    space = rj.nas.space("nb201", channels=8, cells_per_stage=2)
    reference = tiny_network.TinyNetwork(8, 2, genotypes.Structure.str2structure(space.arch_string(arch)), 10)
    randomize(reference)
    clf = rj.zoo.from_torch("nas.nb201", state_dict(reference), arch=arch, channels=8, cells_per_stage=2)
    clf = clf.replace(mean=(0.0,), std=(1.0,))  # xautodl's network takes normalised images
    images = np.random.default_rng(0).normal(size=(4, 32, 32, 3)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(clf(images)), torch_logits(reference, images), atol=1e-5, rtol=1e-5)


def _layer_macs(model: torch.nn.Module, image_shape: tuple[int, int, int]) -> int:
    """Multiply-accumulates of every convolution and linear layer in one forward pass of one
    image (C, H, W), counted from the shapes each layer sees (forward hooks)."""
    total = [0]

    def count(layer, inputs, output):
        if isinstance(layer, torch.nn.Conv2d):
            kernel = layer.kernel_size[0] * layer.kernel_size[1]
            total[0] += output[0].numel() * layer.in_channels // layer.groups * kernel
        else:
            total[0] += layer.in_features * layer.out_features

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    model.eval()
    with torch.no_grad():
        model(torch.zeros((1, *image_shape)))
    for hook in hooks:
        hook.remove()
    return total[0]


@pytest.mark.parametrize("arch", [
    11472,  # the ResNet cell
    "|nor_conv_1x1~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|nor_conv_1x1~0|nor_conv_3x3~1|skip_connect~2|",
    "|skip_connect~0|+|avg_pool_3x3~0|none~1|+|none~0|skip_connect~1|avg_pool_3x3~2|",  # only the macro costs
])
def test_nb201_macs_with_several_cells_per_stage_are_xautodls_layer_count(arch):
    """NB201Space.cost for N = 3 cells per stage on non-square images, against xautodl's
    TinyNetwork counted layer by layer (and its parameter count)."""
    tiny_network = pytest.importorskip("xautodl.models.cell_infers.tiny_network")
    genotypes = pytest.importorskip("xautodl.models.cell_searchs.genotypes")
    space = rj.nas.space("nb201", channels=4, cells_per_stage=3, input_shape=(16, 12, 3), num_classes=7)
    reference = tiny_network.TinyNetwork(4, 3, genotypes.Structure.str2structure(space.arch_string(arch)), 7)
    cost = space.cost(arch)
    assert cost.macs == _layer_macs(reference, (3, 16, 12))
    assert cost.flops == 2 * cost.macs
    assert cost.params == sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize("space_name, arch", [
    ("bignas_resnet_basic", "bignas_resnet18_9M"),
    ("bignas_resnet_basic", "bignas_resnet18_37M"),  # block-wise kernel and expand lists, 7x7 stem
    ("bignas_resnet_bottleneck_cifar", 1000),
])
def test_bignas_subnet_matches_robustart_definition(space_name, arch):
    from benchmarks.torch_bignas import BigNASResNet

    space = rj.nas.space(space_name)
    config = space.resolve(arch)
    reference = BigNASResNet(config.block, config.widths, config.depths, config.kernels, config.expand_ratios,
                             strides=space.strides, in_channels=space.in_channels, num_classes=space.num_classes)
    randomize(reference)
    clf = rj.zoo.from_torch(f"nas.{space_name}", state_dict(reference), arch=arch).replace(mean=(0.0,), std=(1.0,))
    side = config.resolution
    images = np.random.default_rng(0).normal(size=(2, side, side, space.in_channels)).astype(np.float32)
    if space.input_size != side:
        clf = clf.replace(input_shape=(side, side, space.in_channels))
    np.testing.assert_allclose(np.asarray(clf(images)), torch_logits(reference, images), atol=1e-5, rtol=1e-4)


def test_a_converter_names_what_does_not_fit():
    tiny_network = pytest.importorskip("xautodl.models.cell_infers.tiny_network")
    genotypes = pytest.importorskip("xautodl.models.cell_searchs.genotypes")
    reference = tiny_network.TinyNetwork(8, 1, genotypes.Structure.str2structure(
        rj.nas.space("nb201").arch_string(11472)), 10)
    with pytest.raises(ValueError, match="does not fit the model"):  # the state dict is of another cell
        rj.zoo.from_torch("nas.nb201", state_dict(reference), arch=0, channels=8, cells_per_stage=1)


BLOCK_KERNELS = BigNASSpace(  # kernels of the blocks searched too, so block kernels are sliced
    name="test_kernels", block="bottleneck", widths=((8, 16), (16, 24), (24, 32), (32,), (32, 48)),
    depths=((1,), (1, 2), (1, 2), (1,), (1, 3)), kernels=((3, 5), (3, 5), (3,), (3, 5, 7), (3,)),
    expand_ratios=((0,), (0.5, 1.0), (0.25,), (1.0,), (0.5,)), resolutions=(8,), strides=(1, 2, 1, 2, 1),
    in_channels=1, num_classes=10, mean=(0.3,), std=(0.4,))


@pytest.mark.parametrize("space", [rj.nas.space("nb201_digits"), rj.nas.space("bignas_resnet_basic_digits"),
                                   BLOCK_KERNELS], ids=lambda s: s.name)
def test_sliced_subnet_equals_the_subnet_run_through_the_supernet(space, digits_batch):
    supernet = rj.nas.Supernet.create(space, key=jax.random.key(0))
    module = supernet.module()
    randomize_nnx_batch_norm(module)
    supernet = rj.nas.Supernet.from_module(space, module)
    images = digits_batch[0][:8]
    archs = [space.config(i) for i in np.random.default_rng(1).integers(len(space), size=4)]
    for arch in [*archs, space.config(0), space.config(len(space) - 1)]:
        sliced = supernet.subnet(arch)
        through = supernet.classifier(arch)
        np.testing.assert_allclose(np.asarray(sliced(images)), np.asarray(through(images)), atol=1e-5, rtol=1e-5)
        assert rj.zoo.count_params(sliced) < rj.zoo.count_params(through) or arch == space.config(len(space) - 1)


def test_every_subnet_through_the_supernet_shares_one_program(digits_batch):
    space = rj.nas.space("bignas_resnet_basic_digits")
    supernet = rj.nas.Supernet.create(space, key=jax.random.key(0))
    forward = jax.jit(lambda clf, x: clf(x))
    for arch in space.sample(jax.random.key(0), 5):
        forward(supernet.classifier(arch, name="subnet"), digits_batch[0][:4]).block_until_ready()
    assert forward._cache_size() == 1


def test_resolution_is_applied_inside_the_classifier():
    space = dataclasses.replace(rj.nas.space("bignas_resnet_basic_digits"), resolutions=(6, 8), input_size=8)
    small = space.resolve(dataclasses.replace(space.smallest(), resolution=6))
    clf = rj.nas.Supernet.create(space, key=jax.random.key(0)).subnet(small)
    assert clf.input_shape == (8, 8, 1) and clf(np.zeros((2, 8, 8, 1), np.float32)).shape == (2, 10)
