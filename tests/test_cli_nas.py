"""The `robustjax nas` commands and NAS models in `robustjax evaluate`."""

import json

import pytest

from robustjax.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_nas_list_names_every_space(capsys):
    code, out, _ = run(capsys, "nas", "list")
    assert code == 0
    for name in ("nb201 ", "nb201_digits", "bignas_resnet_basic ", "bignas_resnet_bottleneck ",
                 "bignas_resnet_basic_digits"):
        assert name in out
    assert "15,625" in out and "bundled" in out


def test_nas_card_of_the_resnet_cell(capsys):
    code, out, _ = run(capsys, "nas", "card", "nb201", "11472")
    card = json.loads(out)
    assert code == 0 and card["canonical_index"] == 2528 and card["params"] == 559386
    code, out, _ = run(capsys, "nas", "card", "bignas_resnet_basic", "bignas_resnet18_9M")
    assert json.loads(out)["named"] == ["bignas_resnet18_9M"]


@pytest.mark.parametrize("argv, message", [
    (["nas", "card", "nb210", "0"], "unknown search space 'nb210'"),
    (["nas", "card", "nb201", "15625"], "out of range"),
    (["nas", "card", "nb201", "|none~0|"], "3 nodes"),
    (["evaluate", "--model", "digits_cnn", "--arch", "3"], "apply to NAS models"),
    (["evaluate", "--model", "nas.nb201_digits", "--arch", "|bad|"], "3 nodes"),
])
def test_bad_nas_arguments_print_one_error(argv, message, capsys, tmp_path):
    code, _, err = run(capsys, *argv, *(["--out", str(tmp_path)] if argv[0] == "evaluate" else []))
    assert code == 2 and message in err and "Traceback" not in err


def test_train_a_supernet_then_evaluate_one_of_its_subnets(tmp_path, capsys):
    out = tmp_path / "supernet"
    code, text, err = run(capsys, "nas", "train", "nb201_digits", "--out", str(out), "--steps", "6",
                          "--checkpoint-every", "3", "--batch-size", "16")
    assert code == 0, err
    assert "step 6/6" in text and (out / "supernet.json").is_file()
    plan = tmp_path / "plan.toml"
    plan.write_text('batch_size = 16\nnum_examples = 16\n[[attacks]]\nname = "fgsm"\neps = 0.1\n[sanity]\nenabled = false\n')
    code, text, err = run(capsys, "evaluate", "--model", "nas.nb201_digits", "--supernet", str(out), "--arch",
                          "11472", "--plan", str(plan), "--out", str(tmp_path / "report"))
    assert code == 0, err
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["model"]["name"] == "nas.nb201_digits:11472"
    code, _, err = run(capsys, "evaluate", "--model", "nas.bignas_resnet_basic_digits", "--supernet", str(out),
                       "--plan", str(plan), "--out", str(tmp_path / "other"))
    assert code == 2 and "holds a supernet of nb201_digits" in err


def test_nas_evaluate_prints_a_table_per_network(tmp_path, capsys):
    plan = tmp_path / "plan.toml"
    plan.write_text('batch_size = 16\nnum_examples = 16\n[[attacks]]\nname = "fgsm"\neps = [0.05, 0.1, 0.2]\n')
    out = tmp_path / "results.json"
    code, text, err = run(capsys, "nas", "evaluate", "bignas_resnet_basic_digits", "--ids", "0,7-8", "--plan",
                          str(plan), "--population-size", "2", "--out", str(out))
    assert code == 0, err
    results = json.loads(out.read_text())
    assert len(results) == 3 and "3 networks of bignas_resnet_basic_digits" in text
    # Long BigNAS ids fold in their column; the headers and figures stay whole in 80 columns.
    header = next(line for line in text.splitlines() if " network " in line)
    assert "MFLOPs" in header and "clean" in header and "…" not in text
    assert "mean accuracy" not in text and "flip prob" not in text  # no caption for columns it lacks
    assert all(0.0 <= r["attacks"][0]["robust_accuracy"] <= r["clean_accuracy"] for r in results)
    plan.write_text('batch_size = 16\nnum_examples = 16\n[[attacks]]\nname = "fgsm"\neps = 0.1\n'
                    '[sequences]\nnames = ["translate"]\nbatch_size = 8\n')
    code, text, err = run(capsys, "nas", "evaluate", "nb201_digits", "--ids", "0-1", "--plan", str(plan),
                          "--precision", "bfloat16", "--out", str(out))
    assert code == 0, err
    assert "network " in text and "flip prob.: mean ImageNet-P flip probability" in text
    assert "mean accuracy" not in text
    assert "flip prob." in text and all(0 <= r["sequences"][0]["flip_probability"] <= 1
                                        for r in json.loads(out.read_text()))
    code, _, err = run(capsys, "nas", "evaluate", "nb201_digits", "--ids", "0", "--precision", "fp16")
    assert code == 2 and "precision must be one of ['bfloat16', 'float32'], got 'fp16'" in err
    code, _, err = run(capsys, "nas", "evaluate", "nb201", "--ids", "0")
    assert code == 2 and "no bundled supernet" in err
    code, _, err = run(capsys, "nas", "evaluate", "nb201_digits", "--ids", "3-x")
    assert code == 2 and "--ids takes ids and ranges" in err
