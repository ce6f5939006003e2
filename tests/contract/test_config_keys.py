"""minify_contract.config_keys: which torch config module a JobSpec.config key sets, one function for
the capture, the worker's backends, the culprit phase and repro.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minify_contract.config_keys import CONFIG_MODULES, INDUCTOR_CONFIG, config_key, config_setting


@pytest.mark.fast
def test_a_key_without_a_module_is_an_inductor_setting() -> None:
    assert config_setting("cpp.inject_relu_bug_TESTING_ONLY") == (INDUCTOR_CONFIG, "cpp.inject_relu_bug_TESTING_ONLY")
    assert config_setting("max_autotune") == (INDUCTOR_CONFIG, "max_autotune")


@pytest.mark.parametrize("module", ["torch._dynamo.config", "torch._functorch.config", "torch._inductor.config"])
@pytest.mark.fast
def test_a_key_that_names_its_module_sets_the_setting_there(module: str) -> None:
    assert config_setting(f"{module}.some.setting") == (module, "some.setting")


@pytest.mark.fast
def test_a_key_that_only_starts_like_a_module_name_is_inductors() -> None:
    assert config_setting("torch._dynamo.configx") == (INDUCTOR_CONFIG, "torch._dynamo.configx")


@pytest.mark.parametrize("module", list(CONFIG_MODULES))
@pytest.mark.fast
def test_the_key_a_capture_records_reads_back_as_its_module_and_setting(module: str) -> None:
    assert config_setting(config_key(module, "cpp.threads")) == (module, "cpp.threads")


@pytest.mark.fast
def test_inductor_settings_are_recorded_without_their_module() -> None:
    assert config_key(INDUCTOR_CONFIG, "cpp.threads") == "cpp.threads"
    assert config_key("torch._dynamo.config", "assume_static_by_default") == \
        "torch._dynamo.config.assume_static_by_default"


def test_the_module_does_not_import_torch() -> None:
    script = "import sys, minify_contract.config_keys; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
