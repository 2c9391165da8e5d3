"""The shared PyTorch-conversion helpers: safe loading, layout changes, error reporting."""

import numpy as np
import pytest

from robustjax.zoo.convert import (
    TorchWeights,
    conv_kernel,
    linear_kernel,
    load_state_dict,
    strip_wrappers,
)


def test_layouts():
    conv = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)  # (out, in, kh, kw)
    assert conv_kernel(conv).shape == (4, 5, 3, 2)
    assert conv_kernel(conv)[1, 2, 0, 1] == conv[1, 0, 1, 2]
    linear = np.arange(6).reshape(2, 3)  # (out, in)
    np.testing.assert_array_equal(linear_kernel(linear), linear.T)


def test_every_missing_and_unused_tensor_is_named():
    weights = TorchWeights({"a.weight": np.ones((2, 3)), "a.bias": np.ones(2), "extra": np.ones(4),
                            "bn.num_batches_tracked": np.zeros(())}, "ckpt.pt")
    weights.linear("a")
    weights.take("missing.weight")
    with pytest.raises(ValueError, match=r"ckpt.pt does not fit.*missing missing.weight; unexpected extra \(4,\)"):
        weights.check_all_used()


def test_bias_taken_only_when_present():
    weights = TorchWeights({"c.weight": np.ones((4, 3, 1, 1))})
    assert set(weights.conv("c")) == {"kernel"}
    weights.check_all_used()


def test_wrappers_and_prefixes_are_removed():
    assert strip_wrappers({"module.fc.weight": 1, "module.fc.bias": 2}) == {"fc.weight": 1, "fc.bias": 2}
    assert strip_wrappers({"module.a": 1, "b": 2}) == {"module.a": 1, "b": 2}


def test_safetensors_round_trip(tmp_path):
    from safetensors.numpy import save_file

    save_file({"module.fc.weight": np.ones((2, 3), np.float32)}, tmp_path / "w.safetensors")
    loaded = load_state_dict(tmp_path / "w.safetensors")
    assert list(loaded) == ["fc.weight"] and loaded["fc.weight"].shape == (2, 3)


@pytest.mark.torch
def test_torch_checkpoint_is_loaded_weights_only(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"state_dict": {"fc.weight": torch.ones(2, 3), "bn.num_batches_tracked": torch.tensor(3)}},
               tmp_path / "ok.pt")
    loaded = load_state_dict(tmp_path / "ok.pt")
    assert loaded["fc.weight"].dtype == np.float32 and loaded["bn.num_batches_tracked"] == 3

    torch.save({"fc.weight": torch.ones(2), "payload": Payload()}, tmp_path / "unsafe.pt")
    with pytest.raises(ValueError, match="not a weights-only PyTorch checkpoint"):
        load_state_dict(tmp_path / "unsafe.pt")


@pytest.mark.torch
@pytest.mark.parametrize("content", [b"", bytes(np.random.default_rng(0).integers(0, 256, 3000, np.uint8))],
                         ids=["empty", "random bytes"])
def test_a_file_that_is_no_torch_checkpoint_is_one_line(tmp_path, content):
    (tmp_path / "bad.pth").write_bytes(content)
    with pytest.raises(ValueError, match=r"^bad.pth cannot be read as a weights-only PyTorch checkpoint \(.+\): "
                                         "a truncated or corrupt file, or another format$") as excinfo:
        load_state_dict(tmp_path / "bad.pth")
    assert "\n" not in str(excinfo.value) and "weights_only" not in str(excinfo.value)


class Payload:
    """An arbitrary class: unpickling it would run code, so weights-only loading refuses it."""


def test_unknown_format_and_missing_file(tmp_path):
    (tmp_path / "w.pkl").write_bytes(b"")
    with pytest.raises(ValueError, match="unsupported checkpoint format '.pkl'"):
        load_state_dict(tmp_path / "w.pkl")
    with pytest.raises(ValueError, match="no checkpoint file"):
        load_state_dict(tmp_path / "absent.safetensors")
