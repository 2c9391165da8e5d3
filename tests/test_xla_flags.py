import os

from robustjax.xla_flags import DEFAULT_FLAGS, apply_default_flags


def test_default_flags_are_appended_once(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    monkeypatch.delenv("ROBUSTJAX_KEEP_XLA_FLAGS", raising=False)
    apply_default_flags()
    apply_default_flags()
    flags = os.environ["XLA_FLAGS"].split()
    assert flags[0] == "--xla_force_host_platform_device_count=8"
    assert flags.count(DEFAULT_FLAGS[0]) == 1


def test_a_flag_the_user_set_is_kept(monkeypatch):
    user_value = "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_REDUCE"
    monkeypatch.setenv("XLA_FLAGS", user_value)
    monkeypatch.delenv("ROBUSTJAX_KEEP_XLA_FLAGS", raising=False)
    apply_default_flags()
    assert os.environ["XLA_FLAGS"] == user_value


def test_opt_out(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv("ROBUSTJAX_KEEP_XLA_FLAGS", "1")
    apply_default_flags()
    assert os.environ["XLA_FLAGS"] == ""
