import json

import pytest

import robustjax as rj
from robustjax.evaluation import default_plan, load_plan, plan_from_dict


def test_default_plans_hold_fgsm_and_pgd_at_three_epsilons():
    for dataset in ("digits/test", "cifar10/test"):
        plan = default_plan(dataset)
        names = [a.name for a in plan.attacks]
        assert names == ["fgsm"] * 3 + ["pgd"] * 3
        assert all(a.norm == "linf" for a in plan.attacks if a.name == "pgd")
        assert len({a.eps for a in plan.attacks}) == 3
    assert max(a.eps for a in default_plan("digits/test").attacks) == 0.2
    assert max(a.eps for a in default_plan("cifar10/test").attacks) == pytest.approx(8 / 255)


def test_toml_and_json_plans_expand_eps_lists(tmp_path):
    (tmp_path / "p.toml").write_text('batch_size = 16\nnum_examples = 40\n[[attacks]]\nname = "pgd"\neps = [0.1, 0.2]\nsteps = 3\nnorm = "l2"\n')
    (tmp_path / "p.json").write_text(json.dumps({"batch_size": 16, "num_examples": 40,
                                                 "attacks": [{"name": "pgd", "eps": [0.1, 0.2], "steps": 3, "norm": "l2"}]}))
    toml_plan, json_plan = load_plan(tmp_path / "p.toml"), load_plan(tmp_path / "p.json")
    assert toml_plan == json_plan
    assert toml_plan.attacks == (rj.attacks.PGD(eps=0.1, steps=3, norm="l2"), rj.attacks.PGD(eps=0.2, steps=3, norm="l2"))
    assert toml_plan.as_dict()["attacks"][1]["eps"] == 0.2


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"batch": 3}, r"unknown key\(s\) \['batch'\]"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"num_examples": -5}, "num_examples must be an integer >= 1"),
        ({"seed": "x"}, "seed must be an integer"),
        ({"attacks": {"name": "pgd"}}, "must be a list"),
        ({"attacks": [{"eps": 0.1}]}, r"attacks\[0\] must be a table with a string 'name'"),
        ({"attacks": [{"name": "pgd", "eps": -1}]}, r"attacks\[0\] \(pgd\): eps must be finite and >= 0"),
        ({"attacks": [{"name": "fgsm", "eps": []}]}, "empty list"),
        ({"attacks": [{"name": "pgd", "steps": 0}]}, "steps must be an integer >= 1"),
        ({"attacks": [{"name": "cw"}]}, "unknown attack 'cw'"),
        ({"attacks": [{"name": "pgd", "nrm": "l2"}]}, r"no parameter\(s\) \['nrm'\]"),
    ],
)
def test_malformed_plans_name_the_problem(raw, message):
    with pytest.raises(ValueError, match=message):
        plan_from_dict(raw)


def test_unreadable_plan_files(tmp_path):
    (tmp_path / "bad.toml").write_text("batch_size = = 3")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_plan(tmp_path / "bad.toml")
    with pytest.raises(ValueError, match="no plan file"):
        load_plan(tmp_path / "missing.toml")
