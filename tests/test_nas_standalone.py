"""Standalone NAS-Bench-201 networks (each cell with its own weights) as one population: each
network gets the logits and attack results it gets alone, unchosen ops cannot leak into the
sum, ``load_folder`` reads converted folders and xautodl state dicts, and what does not fit
is refused in one line naming the network."""

import jax
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax.nas import build
from robustjax.nas.standalone import from_networks, load_folder

SPACE = rj.nas.space("nb201_digits")
# Cells whose convolutions sit on different edges, with none, skip and pooling edges, and one
# without any weights.
ARCHS = [SPACE.config(i) for i in (11472, 0, 9)] + [SPACE.resolve(
    "|skip_connect~0|+|avg_pool_3x3~0|none~1|+|none~0|skip_connect~1|avg_pool_3x3~2|")]
KEY = jax.random.key(0)
FGSM = rj.attacks.create("fgsm", eps=0.1)


def network(config, seed: int, space=SPACE) -> nnx.Module:
    """The standalone network of ``config`` with random weights and batch-norm statistics
    (drawn with NumPy: initialising modules eagerly costs seconds)."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: build.build_network(space, config, key=KEY)))
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = path[-1].key
        if name in ("scale", "var"):
            return rng.uniform(0.5, 1.5, leaf.shape).astype(np.float32)
        spread = 0.2 if name in ("mean", "bias") else 1.5 / np.prod(leaf.shape[:-1]) ** 0.5
        return rng.normal(0.0, spread, leaf.shape).astype(np.float32)

    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(draw, nnx.to_pure_dict(state)))
    return nnx.merge(graphdef, state)


@jax.jit
def population_logits(classifier, x):
    return rj.nas.Population(classifier, (0, 0, 0), ()).map(lambda clf, x: clf(x), x)


@jax.jit
def population_fgsm(classifier, x, y):
    return rj.nas.Population(classifier, (0, 0, 0), ()).map(lambda clf, x, y: FGSM(clf, x, y, key=KEY), x, y)


@pytest.fixture(scope="module")
def modules():
    return [network(config, seed) for seed, config in enumerate(ARCHS)]


@pytest.fixture(scope="module")
def alone(modules):
    return [build.as_classifier(SPACE, module, config, name=config.arch_id) for module, config in zip(modules, ARCHS)]


@pytest.fixture(scope="module")
def population(modules, alone):
    # Every form a network may come in: a module, its state, a classifier, its pure dict.
    forms = [modules[0], nnx.state(modules[1]), alone[2], nnx.to_pure_dict(nnx.state(modules[3]))]
    return from_networks(SPACE, ARCHS, forms)


@pytest.fixture(scope="module")
def images(digits_batch):
    return digits_batch[0][:8], digits_batch[1][:8]


def test_each_network_gets_the_logits_and_attack_result_it_gets_alone(population, alone, images):
    x, y = images
    assert population.arch_ids == tuple(config.arch_id for config in ARCHS) and population.axes == (0, 0, 0)
    logits = np.asarray(population_logits(population.classifier, x))
    attacked = population_fgsm(population.classifier, x, y)
    member_logits = jax.jit(lambda clf, x: clf(x))  # one program serves every member
    on_its_own = jax.jit(lambda clf, x, y: (clf(x), FGSM(clf, x, y, key=KEY)))  # one program per network
    for index, clf in enumerate(alone):
        own_logits, result = on_its_own(clf, x, y)
        np.testing.assert_allclose(logits[index], np.asarray(own_logits), atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(member_logits(population.member(index).replace(name="member"), x)),
                                   logits[index], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(attacked.x_adv[index]), np.asarray(result.x_adv), atol=1e-5)
        np.testing.assert_array_equal(np.asarray(attacked.success[index]), np.asarray(result.success))
    assert member_logits._cache_size() == 1
    assert np.abs(logits).max() > 0.5 and len({tuple(r) for r in np.argmax(logits, -1)}) > 1  # networks differ
    assert 0 < np.asarray(attacked.success).mean() < 1


def test_unchosen_ops_are_neutral_and_cannot_leak_inf_or_nan(population, images):
    params, stats, choices = population.classifier.params
    cell = nnx.to_pure_dict(params)["cells"][0]
    variance = nnx.to_pure_dict(stats)["cells"][0]
    for index, config in enumerate(ARCHS):
        for edge, op in enumerate(config.ops):
            for slot, kind in (("conv1x1", "nor_conv_1x1"), ("conv3x3", "nor_conv_3x3")):
                kernel = np.asarray(cell[slot][edge]["conv"]["kernel"][index])
                assert (np.abs(kernel).max() > 0) == (op == kind), (config.arch_id, edge, slot)
                if op != kind:
                    np.testing.assert_array_equal(np.asarray(variance[slot][edge]["bn"]["var"][index]), 1.0)
    # inf in every unchosen convolution: the population's logits stay each network's own.
    poisoned = jax.tree.map(lambda a: a, params)
    for block in (c for c in poisoned["cells"].values() if "conv1x1" in c):
        for slot, kind in (("conv1x1", 2), ("conv3x3", 3)):
            for edge in range(6):
                kernel = block[slot][edge]["conv"]["kernel"]
                unchosen = np.asarray(choices[:, edge, kind] == 0)[:, None, None, None, None]
                kernel[...] = np.where(unchosen, np.inf, np.asarray(kernel[...]))
    clean = np.asarray(population_logits(population.classifier, images[0]))
    leaked = np.asarray(population_logits(population.classifier.replace(params=(poisoned, stats, choices)),
                                          images[0]))
    np.testing.assert_array_equal(leaked, clean)


def xautodl_network(config, channels: int = 8, cells: int = 1, in_channels: int = 1):
    """xautodl's TinyNetwork of ``config``, with a stem for ``in_channels`` (xautodl's takes 3),
    random weights and batch-norm statistics."""
    torch = pytest.importorskip("torch")
    tiny_network = pytest.importorskip("xautodl.models.cell_infers.tiny_network")
    genotypes = pytest.importorskip("xautodl.models.cell_searchs.genotypes")
    from tests.zoo_parity import randomize

    model = tiny_network.TinyNetwork(channels, cells, genotypes.Structure.str2structure(config.arch_string), 10)
    model.stem[0] = torch.nn.Conv2d(in_channels, channels, 3, padding=1, bias=False)
    return randomize(model, seed=config.index % 1000)


def torch_logits(model, images: np.ndarray) -> np.ndarray:
    import torch

    normalised = (images - np.float32(SPACE.mean)) / np.float32(SPACE.std)
    with torch.no_grad():
        return model(torch.from_numpy(normalised.transpose(0, 3, 1, 2).copy()))[1].numpy()


@pytest.mark.torch
def test_load_folder_reads_converted_folders_and_xautodl_state_dicts(tmp_path, images):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    models = [xautodl_network(config) for config in ARCHS]
    folder = tmp_path / "networks"
    folder.mkdir()
    torch.save(models[0].state_dict(), folder / f"{ARCHS[0].index}.pth")
    torch.save(models[1].state_dict(), folder / f"{ARCHS[1].index:06d}.pt")  # zero-padded as NATS-Bench names them
    checkpoint = tmp_path / "converted.pth"
    torch.save(models[2].state_dict(), checkpoint)
    rj.zoo.convert_checkpoint("nas.nb201_digits", checkpoint, folder / str(ARCHS[2].index), arch=ARCHS[2].index)
    save_file(models[3].state_dict(), folder / f"{ARCHS[3].index}.safetensors")
    (folder / "notes.txt").write_text("not a network")
    population = from_networks(SPACE, ARCHS, load_folder(SPACE, folder, ARCHS))
    logits = np.asarray(population_logits(population.classifier, images[0]))
    for index, model in enumerate(models):
        np.testing.assert_allclose(logits[index], torch_logits(model, images[0]), atol=1e-5, rtol=1e-5)


def one_line(excinfo) -> None:
    assert "\n" not in str(excinfo.value), str(excinfo.value)


def test_networks_that_do_not_fit_are_refused():
    bignas = rj.nas.space("bignas_resnet_basic_digits")
    with pytest.raises(ValueError, match=r"standalone BigNAS networks of one architecture stack with "
                       r"Population.stack") as excinfo:
        from_networks(bignas, [bignas.smallest()], [None])
    one_line(excinfo)
    with pytest.raises(ValueError, match="stack with Population.stack"):
        load_folder(bignas, ".", [bignas.smallest()])
    narrow = rj.nas.space("nb201_digits", channels=4)
    with pytest.raises(ValueError, match=r"^network 1 \(nb201:0\): expected a network of nb201_digits \(C=8, N=1, "
                       r"10 classes, 1 input channels\), found C=4, N=1, 10 classes, 1 input channels "
                       r"\(stem_conv.kernel has shape \(3, 3, 1, 4\), expected \(3, 3, 1, 8\) and \d+ more\)$") as excinfo:
        from_networks(SPACE, ARCHS[:2], [network(ARCHS[0], 0), network(ARCHS[1], 1, narrow)])
    one_line(excinfo)
    deeper = rj.nas.space("nb201_digits", cells_per_stage=2)
    with pytest.raises(ValueError, match=r"network 0 \(nb201:11472\): expected .*N=1.*, found C=8, N=2, 10 classes"):
        from_networks(SPACE, ARCHS[:1], [network(ARCHS[0], 0, deeper)])
    five = rj.nas.space("nb201_digits", num_classes=5)
    with pytest.raises(ValueError, match=r"network 0 \(nb201:11472\): expected .* 10 classes.*, found .* 5 classes"):
        from_networks(SPACE, ARCHS[:1], [network(ARCHS[0], 0, five)])
    with pytest.raises(ValueError, match=r"^network 1 \(nb201:9\): the cell \|avg_pool_3x3~0\|.* has convolutions "
                       r"edge 5 3x3, normal cell 0 of these weights has edge 1 1x1, edge 3 1x1$") as excinfo:
        from_networks(SPACE, [ARCHS[0], ARCHS[2]], [network(ARCHS[0], 0), network(ARCHS[1], 1)])
    one_line(excinfo)
    with pytest.raises(ValueError, match="2 archs but 1 networks"):
        from_networks(SPACE, ARCHS[:2], [network(ARCHS[0], 0)])


@pytest.mark.torch
def test_folders_that_do_not_fit_are_refused(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    arch = ARCHS[1]
    torch.save(xautodl_network(arch).state_dict(), tmp_path / f"{arch.index}.pth")
    wanted = [arch, *(SPACE.config(i) for i in (5, 6, 7, 8, 9, 10))]
    with pytest.raises(ValueError, match=r"lacks 6 of the 7 requested architectures \(indices 5, 6, 7, 8, 9, \.\.\.\); "
                       r"expected a folder \{index\}/ or a file \{index\}.pth per architecture") as excinfo:
        load_folder(SPACE, tmp_path, wanted)
    one_line(excinfo)

    wide = tmp_path / "wide"
    wide.mkdir()  # NAS-Bench-201's own C=16 on RGB, in the digits space
    torch.save(xautodl_network(arch, channels=16, in_channels=3).state_dict(), wide / f"{arch.index}.pth")
    with pytest.raises(ValueError, match=r"^nb201:0 \(.*0.pth\): expected a network of nb201_digits \(C=8, N=1, 10 "
                       r"classes, 1 input channels\), found C=16, N=1, 10 classes, 3 input channels \(stem_conv.kernel "
                       r"has shape \(3, 3, 3, 16\), expected \(3, 3, 1, 8\)") as excinfo:
        load_folder(SPACE, wide, [arch])
    one_line(excinfo)

    other_space = tmp_path / "bignas"
    other_space.mkdir()
    torch.save({"first_conv.conv.weight": torch.zeros(8, 1, 3, 3)}, other_space / f"{arch.index}.pth")
    with pytest.raises(ValueError, match=r"^nb201:0 \(.*0.pth\): no reduction block \(cells.N.conv_a\); not a "
                       r"NAS-Bench-201 TinyNetwork$"):
        load_folder(SPACE, other_space, [arch])

    mislabelled = tmp_path / "mislabelled"  # a converted network of another cell under this index
    rj.zoo.convert_checkpoint("nas.nb201_digits", tmp_path / f"{arch.index}.pth", mislabelled / "11472", arch=arch.index)
    with pytest.raises(ValueError, match=r"^nb201:11472 \(.*11472\): holds nb201:0, not nb201:11472$"):
        load_folder(SPACE, mislabelled, [11472])

    class Payload:
        def __reduce__(self):
            return (print, ("this ran",))

    unsafe = tmp_path / "unsafe"
    unsafe.mkdir()
    torch.save({"stem.0.weight": torch.zeros(1), "payload": Payload()}, unsafe / f"{arch.index}.pth")
    with pytest.raises(ValueError, match=r"^nb201:0 \(.*0.pth\): 0.pth is not a weights-only PyTorch checkpoint "
                       r"and will not be unpickled \(it holds code: GLOBAL \S*print\)") as excinfo:
        load_folder(SPACE, unsafe, [arch])
    one_line(excinfo)
    assert "this ran" not in capsys.readouterr().out


@pytest.mark.torch
def test_a_sweep_of_a_folder_of_standalone_networks_gives_each_the_figures_it_gets_alone(tmp_path, capsys):
    """`sweep run --space nb201_digits --weights DIR` over three xautodl state dicts: one
    population; every row carries NAS-Bench-201's index, and each network's figures are
    those of `robustjax evaluate` of that network alone."""
    torch = pytest.importorskip("torch")
    from robustjax.cli import main
    from robustjax.evaluation import evaluate
    from robustjax.evaluation.plan import plan_from_dict
    from robustjax.nas.standalone import network as standalone_network
    from robustjax.sweep import export
    from robustjax.sweep.store import Store

    folder = tmp_path / "networks"
    folder.mkdir()
    for config in ARCHS[:3]:
        torch.save(xautodl_network(config).state_dict(), folder / f"{config.index}.pth")
    raw = {"batch_size": 16, "num_examples": 16, "sanity": {"enabled": False},
           "attacks": [{"name": "fgsm", "eps": 0.1}]}
    (tmp_path / "plan.toml").write_text('batch_size = 16\nnum_examples = 16\n[[attacks]]\nname = "fgsm"\neps = 0.1\n')
    db = tmp_path / "s.sqlite"
    assert main(["sweep", "run", "--db", str(db), "--space", "nb201_digits", "--weights", str(folder),
                 "--plan", str(tmp_path / "plan.toml"), "--population-size", "3", "--quiet"]) == 0
    table = export.table(Store.read(db))
    rows = table.rows
    assert [row["index"] for row in rows] == sorted(config.index for config in ARCHS[:3])
    assert "standalone networks" in table.context and "on 16 examples of digits" in table.context
    digits = rj.data.digits("test")
    weights = load_folder(SPACE, folder, [row["index"] for row in rows])
    for row, weight in zip(rows, weights):
        report = evaluate(standalone_network(SPACE, row["index"], weight), digits, plan_from_dict(raw))
        assert row["clean"] == report["clean"]["accuracy"] and not row["errors"]
        assert row["fgsm eps=0.1"] == report["attacks"][0]["robust_accuracy"]
    assert main(["sweep", "run", "--db", str(tmp_path / "t.sqlite"), "--space", "nb201_digits", "--weights",
                 str(folder), "--ids", "11472,5", "--quiet"]) == 2
    assert "lacks 1 of the 2 requested architectures (indices 5)" in capsys.readouterr().err.replace("\n", "")
