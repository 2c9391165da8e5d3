"""The jaxtyping annotations are checked, not decoration: robustjax imported under
jaxtyping's import hook with beartype (every annotated function and dataclass checks its
arguments and return value, shapes included) runs a workload over the public API.

The hook runs in a subprocess on a small workload, not over the whole suite: checking
every call of every test would slow the suite for little more coverage (the checks run
when a function is called or traced, and the workload calls every entry point)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

WORKLOAD = textwrap.dedent("""
    import warnings

    import beartype  # noqa: F401  (the hook's decorator refers to it)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jaxtyping import install_import_hook

    warnings.simplefilter("ignore")
    CHECKER = "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))"
    with install_import_hook("robustjax", CHECKER):
        import robustjax as rj
        from robustjax import attacks, data, metrics, nas, noise, zoo  # noqa: F401  (loaded lazily otherwise)

    try:  # the hook is on: a batch without its channel axis fails the annotation itself
        rj.noise.corrupt(np.zeros((2, 8, 8), np.float32), "gaussian_noise", 1, key=jax.random.key(0))
    except Exception as error:
        assert type(error).__name__ == "TypeCheckError", f"the hook is not checking: {error!r}"

    key = jax.random.key(0)
    rng = np.random.default_rng(0)
    linear = rj.Classifier(params={"w": jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)},
                           apply_fn=lambda p, x: x.reshape(x.shape[0], -1) @ p["w"], num_classes=3,
                           input_shape=(4, 4, 1))
    x = rng.uniform(0.2, 0.8, (4, 4, 4, 1)).astype(np.float32)
    y = np.asarray(jnp.argmax(linear(jnp.asarray(x)), -1))

    budgets = {"autoattack": dict(eps=0.1, steps=2, square_queries=40), "boundary": dict(max_queries=40),
               "cw_l2": dict(steps=2, binary_search_steps=1), "deepfool": dict(steps=2),
               "hop_skip_jump": dict(max_queries=40), "nes": dict(eps=0.1, max_queries=60, samples=4),
               "rays": dict(eps=0.1, max_queries=40), "sign_opt": dict(max_queries=60),
               "simba": dict(max_queries=40), "spsa": dict(eps=0.1, max_queries=60, samples=2),
               "square": dict(eps=0.1, max_queries=40)}
    for name in rj.attacks.names():
        attack = rj.attacks.create(name, **budgets.get(name, {}))
        jax.eval_shape(lambda x, y: attack(linear, x, y, key=key), x, y)  # the traced program
    rj.attacks.PGD(eps=0.1, steps=2)(linear, x, y, key=key)  # the compacted host loop
    rj.attacks.PGD(eps=0.1, steps=2).sweep(linear, x, y, key=key, eps=[0.05, 0.1], restarts=2)
    rj.attacks.Square(eps=0.1, max_queries=40)(linear, x, y, key=key)
    rj.attacks.transfer(rj.attacks.FGSM(eps=0.1), linear, linear, x, y, key=key)

    images = rng.uniform(0, 1, (2, 32, 32, 3)).astype(np.float32)
    for name in rj.noise.names():
        jax.eval_shape(lambda x: rj.noise.create(name, 2, "cifar")(x, key), images)
    rj.noise.corrupt(images, "gaussian_noise", 1, key=key)
    for name in rj.noise.sequences.names():
        jax.eval_shape(lambda x: rj.noise.perturbation_sequence(x, name, key, length=3), images)

    logits, correct = linear(jnp.asarray(x)), jnp.asarray(y) == 0
    rj.metrics.behaviour.accuracy(logits, jnp.asarray(y))
    rj.metrics.behaviour.Accuracy.empty().update(logits, jnp.asarray(y)).compute()
    rj.metrics.calibration.CalibrationStats.empty(8).update(jax.nn.softmax(logits).max(-1), correct).compute()
    rj.metrics.calibration.expected_calibration_error(jax.nn.softmax(logits).max(-1), correct)
    rj.metrics.imperceptibility.lp_distortion(x, np.clip(x + 0.01, 0, 1))
    rj.metrics.robustart.worst_case_adversarial_robustness(correct, jnp.stack([correct, ~correct]))

    digits = rj.data.load("digits", split="test")
    xs, ys = digits.take(np.arange(8))
    cnn = rj.zoo.load("digits_cnn")
    logits = cnn(jnp.asarray(xs))
    cnn.features(jnp.asarray(xs))
    print("ok")
""")


def test_the_public_api_passes_its_own_type_annotations(tmp_path):
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-4000:]
