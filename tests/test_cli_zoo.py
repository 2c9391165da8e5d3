"""`robustjax zoo list | card | convert`, and evaluating converted weights."""

import json

import jax
import numpy as np
import pytest

import robustjax as rj
from robustjax.evaluation.resume import examples_digest, weights_digest
from tests.helpers import count_compiles
from tests.test_cli import run

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def test_zoo_list_and_card(capsys):
    code, out, _ = run(capsys, "zoo", "list", "wrn_*")
    assert code == 0 and "wrn_28_10" in out and "wrn_70_16" in out and "resnet20" not in out
    code, out, _ = run(capsys, "zoo", "card", "resnet20_cifar")
    card = json.loads(out)
    assert code == 0 and card["num_params"] == 272_474 + 2 * 16 * 7 + 2 * 32 * 7 + 2 * 64 * 7
    assert card["input_shape"] == [32, 32, 3] and card["flops"] > 0


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_convert_then_evaluate_the_converted_weights(tmp_path, capsys, suffix):
    from tests.torch_cifar_twins import ChenyaofoCifarResNet
    from tests.zoo_parity import randomize

    twin = randomize(ChenyaofoCifarResNet(3)).eval()
    checkpoint = tmp_path / f"resnet20{suffix}"
    if suffix == ".pt":
        torch.save({"state_dict": twin.state_dict()}, checkpoint)
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in twin.state_dict().items()}, checkpoint)
    out_dir = tmp_path / "converted"
    code, out, err = run(capsys, "zoo", "convert", "resnet20_cifar", str(checkpoint), "--out", str(out_dir))
    assert code == 0, err
    assert "robustjax evaluate --model resnet20_cifar --weights" in out

    jax.clear_caches()
    key = jax.random.key(0)
    with count_compiles() as compiles:  # built with shapes only: no initialisation to compute and throw away
        clf = rj.zoo.create("resnet20_cifar", weights=out_dir, key=key)
    assert compiles[0] == 0
    x = np.random.default_rng(0).uniform(size=(4, 32, 32, 3)).astype(np.float32)
    with torch.no_grad():
        mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (clf.mean, clf.std))
        expected = twin((torch.from_numpy(x).permute(0, 3, 1, 2) - mean) / std).numpy()
    np.testing.assert_allclose(np.asarray(clf(x)), expected, atol=1e-4)

    images = tmp_path / "images.npz"
    np.savez(images, images=(x * 255).astype(np.uint8), labels=np.arange(4))
    code, _, err = run(capsys, "evaluate", "--model", "resnet20_cifar", "--weights", str(out_dir),
                       "--dataset", str(images), "--plan", str(_fgsm_plan(tmp_path)), "--out", str(tmp_path / "r"))
    assert code == 0, err
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["model"]["name"] == "resnet20_cifar" and report["clean"]["accuracy"] is not None
    # the report names the weights it evaluated: their folder and their hash, and the data's
    assert report["model"]["weights"] == {"source": str(out_dir.resolve()), "sha256": weights_digest(clf)[:16]}
    assert report["dataset"]["sha256"] == examples_digest(rj.data.load(str(images)), None)[:16]
    assert f"{out_dir.resolve()}, sha256 {weights_digest(clf)[:16]}" in (tmp_path / "r" / "report.html").read_text()


def _fgsm_plan(folder):
    plan = folder / "plan.toml"
    plan.write_text('batch_size = 4\n[[attacks]]\nname = "fgsm"\neps = 0.01\n[sanity]\nenabled = false\n')
    return plan


def test_convert_errors_name_the_problem(tmp_path, capsys):
    def error(*argv):
        code, _, err = run(capsys, *argv)
        assert code == 2
        return " ".join(err.split())  # the terminal wraps long messages

    bad = tmp_path / "model.pkl"
    bad.write_bytes(b"not a checkpoint")
    assert "unsupported checkpoint format '.pkl'" in error("zoo", "convert", "resnet20_cifar", str(bad),
                                                           "--out", str(tmp_path / "o"))
    assert "holds no converted weights" in error("evaluate", "--model", "resnet20_cifar", "--weights", str(tmp_path))
    message = error("evaluate", "--model", "resnet20_cifar")
    assert "no pretrained weights" in message and "zoo convert" in message
