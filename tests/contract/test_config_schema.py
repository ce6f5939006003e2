"""minify_contract.config_schema: what a torch takes in JobSpec.config, the check of a spec against
it, and a job failing on its own config never filed as a bug."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from minify_contract.config_schema import (
    CHOICES_CHECKED_WHEN_COMPILING,
    ConfigSchema,
    KeyRule,
    config_mistake,
    config_problems,
    describe_torch_config,
)
from minify_contract.ledger import BUGS_KEY, TicketKeys, add_to_bug_index
from minify_contract.models import JobState, Report
from tests.support.private_redis import private_redis

SCHEMA = ConfigSchema(torch="2.13.0", keys={
    "max_autotune": KeyRule(kinds=["bool"]),
    "cpp.threads": KeyRule(kinds=["int"]),
    "cpp.simdlen": KeyRule(kinds=["int", "null"]),
    "fx_graph_remote_cache_ttl": KeyRule(kinds=["float"]),
    "cpp.inject_relu_bug_TESTING_ONLY": KeyRule(kinds=["null", "str"],
                                                choices=["compile_error", "runtime_error", "accuracy", None]),
    "post_grad_custom_pre_pass": KeyRule(),
})


@pytest.mark.parametrize("config", [
    {},
    {"max_autotune": True, "cpp.threads": 4, "cpp.simdlen": None, "fx_graph_remote_cache_ttl": 2},
    {"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"},
    {"cpp.inject_relu_bug_TESTING_ONLY": None},
    {"post_grad_custom_pre_pass": {"anything": [1, "x"]}},
])
@pytest.mark.fast
def test_a_config_the_torch_takes_has_no_problems(config: dict[str, Any]) -> None:
    assert config_problems(config, SCHEMA) == []


@pytest.mark.parametrize(("config", "problem"), [
    ({"cpp.inject_relu_bug_TESTING_ONLY": "compile_errr"},
     "config cpp.inject_relu_bug_TESTING_ONLY='compile_errr' is not one of 'compile_error', 'runtime_error', "
     "'accuracy', null (torch 2.13.0)"),
    ({"cpp.no_such_key": 1}, "config key 'cpp.no_such_key' is not a setting of torch 2.13.0"),
    ({"max_autotun": True}, "config key 'max_autotun' is not a setting of torch 2.13.0 (did you mean 'max_autotune'?)"),
    ({"max_autotune": "yes"}, "config max_autotune='yes' is a str; torch 2.13.0 takes bool"),
    ({"max_autotune": 1}, "config max_autotune=1 is a int; torch 2.13.0 takes bool"),
    ({"cpp.threads": True}, "config cpp.threads=True is a bool; torch 2.13.0 takes int"),
    ({"cpp.simdlen": 1.5}, "config cpp.simdlen=1.5 is a float; torch 2.13.0 takes int or null"),
])
@pytest.mark.fast
def test_a_config_the_torch_does_not_take_says_which_key_and_what_it_takes(config: dict[str, Any],
                                                                           problem: str) -> None:
    assert config_problems(config, SCHEMA) == [problem]


@pytest.mark.fast
def test_every_problem_is_told_not_only_the_first() -> None:
    problems = config_problems({"cpp.no_such_key": 1, "max_autotune": "yes", "cpp.threads": 2}, SCHEMA)
    assert [problem.split(" ")[1] for problem in problems] == ["key", "max_autotune='yes'"]


@pytest.fixture(scope="module")
def this_torch() -> ConfigSchema:
    return describe_torch_config()


@pytest.mark.fast
def test_this_torchs_schema_takes_every_setting_it_has_now(this_torch: ConfigSchema) -> None:
    from minify_client.capture.config import config_values

    values = config_values()
    assert len(values) > 500
    assert config_problems(values, this_torch) == []


@pytest.mark.fast
def test_this_torchs_schema_reads_kinds_and_choices_from_its_annotations(this_torch: ConfigSchema) -> None:
    import torch

    assert this_torch.torch == torch.__version__
    assert this_torch.keys["max_autotune"] == KeyRule(kinds=["bool"])
    literal = [rule for key, rule in this_torch.keys.items()
               if rule.choices is not None and key not in CHOICES_CHECKED_WHEN_COMPILING]
    assert literal, "no Literal-annotated setting found"
    for key in CHOICES_CHECKED_WHEN_COMPILING:
        assert this_torch.keys[key].choices == CHOICES_CHECKED_WHEN_COMPILING[key]
    assert "torch._dynamo.config.assume_static_by_default" in this_torch.keys
    assert "torch._functorch.config.donated_buffer" in this_torch.keys


@pytest.mark.parametrize(("signature", "config", "blamed"), [
    ("AssertionError: unrecognized config cpp.inject_relu_bug_TESTING_ONLY = 'compile_errr'",
     {"cpp.inject_relu_bug_TESTING_ONLY": "compile_errr"}, "cpp.inject_relu_bug_TESTING_ONLY"),
    ("AssertionError: unrecognized config cpp.inject_relu_bug_TESTING_ONLY = 'x'",
     {"torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY": "x"},
     "torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY"),
    # torch's own default, not the job's setting: not the user's mistake
    ("AssertionError: unrecognized config cpp.inject_relu_bug_TESTING_ONLY = 'x'", {}, None),
    ("CppCompileError: 'tmpN' was not declared in this scope", {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"},
     None),
    (None, {"max_autotune": True}, None),
])
@pytest.mark.fast
def test_a_signature_blames_the_jobs_own_config_only_when_torch_refused_its_value(
        signature: str | None, config: dict[str, Any], blamed: str | None) -> None:
    assert config_mistake(signature, config) == blamed


def _report(signature: str, config: dict[str, Any]) -> Report:
    return Report(status=JobState.succeeded, nodes_original=12, nodes_final=1, checks_total=3, checks_cached=0,
                  signature=signature, graph_shape_hash="f" * 16, failure_kind="compile_error", backend="inductor",
                  device="cpu", config=config)


@pytest.mark.parametrize(("signature", "config", "filed"), [
    ("AssertionError: unrecognized config cpp.inject_relu_bug_TESTING_ONLY = 'compile_errr'",
     {"cpp.inject_relu_bug_TESTING_ONLY": "compile_errr"}, False),
    ("CppCompileError: 'tmpN' was not declared in this scope",
     {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}, True),
])
def test_a_job_that_found_its_own_config_mistake_is_never_filed_as_a_bug(
        tmp_path: Path, signature: str, config: dict[str, Any], filed: bool) -> None:
    with private_redis(tmp_path / "redis.db") as server:
        client = redis.Redis(unix_socket_path=server.socket_file)
        job_id = "0123456789abcdef0123456789abcdef"
        with client.pipeline(transaction=True) as pipe:
            bug = add_to_bug_index(pipe, TicketKeys.for_job(job_id), job_id, _report(signature, config),
                                   "2026-11-28T06:00:00+00:00")
            pipe.execute()
        assert (bug is not None) == filed
        assert client.zcard(BUGS_KEY) == (1 if filed else 0)
