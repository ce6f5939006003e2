"""The Docker images and the compose file: checked statically, without a Docker engine.

Nothing here builds an image. The compose file is validated against the Compose specification's JSON
schema (vendored in docker/schema/) and, where a compose binary exists, by `docker compose config`;
the Dockerfiles are parsed and every path, command and install they name is checked against the repo.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import typing
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import jsonschema
import pytest
import tomllib
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from minify_contract.models import JobSpec

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
COMPOSE_SCHEMA = DOCKER / "schema" / "compose-spec.json"
DOCKERIGNORE = REPO / ".dockerignore"
SERVER_DOCKERFILE = DOCKER / "Dockerfile.server"
WORKER_DOCKERFILE = DOCKER / "Dockerfile.worker"
DOCKERFILES = (SERVER_DOCKERFILE, WORKER_DOCKERFILE)
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CONSOLE_SCRIPTS = set(PYPROJECT["project"]["scripts"])
# The queues jobs are sent to: one per device class of the job spec (cpu, cuda).
JOB_QUEUES = set(typing.get_args(typing.get_type_hints(JobSpec.device_class.fget)["return"]))
TORCH_DISTRIBUTIONS = {"torch", "triton"}
PYTHON_INTERPRETERS = {"python", "python3"}


# --- reading Dockerfiles --------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


@dataclass(frozen=True)
class Copy:
    source: str  # relative to the build context
    destination: str  # in the image


def read_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with their continuation lines joined; comment lines dropped, as Docker does."""
    instructions: list[Instruction] = []
    pending = ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or (not line.strip() and not pending):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).strip().partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def instructions_named(path: Path, keyword: str) -> list[str]:
    return [instruction.arguments for instruction in read_dockerfile(path) if instruction.keyword == keyword]


def exec_form(arguments: str) -> list[str] | None:
    """The argv of an exec-form (JSON array) instruction; None for the shell form."""
    if not arguments.startswith("["):
        return None
    return json.loads(arguments)


def without_flags(arguments: str) -> tuple[dict[str, str], str]:
    """Split leading `--name=value` flags (COPY --from, HEALTHCHECK --interval, ...) from the rest."""
    flags: dict[str, str] = {}
    while arguments.startswith("--"):
        flag, _, arguments = arguments.partition(" ")
        name, _, value = flag[2:].partition("=")
        flags[name] = value
        arguments = arguments.strip()
    return flags, arguments


def copies(path: Path) -> list[Copy]:
    """Every COPY/ADD from the build context (COPY --from=<stage> copies from another stage: skipped)."""
    found: list[Copy] = []
    for instruction in read_dockerfile(path):
        if instruction.keyword not in ("COPY", "ADD"):
            continue
        flags, arguments = without_flags(instruction.arguments)
        if "from" in flags:
            continue
        paths = exec_form(arguments) or shlex.split(arguments)
        *sources, destination = paths
        found.extend(Copy(source, destination) for source in sources)
    return found


def image_file_source(dockerfile: Path, image_path: str) -> Path | None:
    """The repository file that `image_path` in the built image comes from, if a COPY puts it there."""
    wanted = PurePosixPath(image_path)
    for copy in copies(dockerfile):
        source = REPO / copy.source
        destination = PurePosixPath(copy.destination)
        if copy.destination.endswith("/"):
            destination /= source.name  # COPY file dir/ keeps the file's name
        if wanted == destination and source.is_file():
            return source
        if wanted.is_relative_to(destination) and source.is_dir():
            candidate = source.joinpath(*wanted.relative_to(destination).parts)
            if candidate.is_file():
                return candidate
    return None


def healthcheck_command(dockerfile: Path) -> list[str]:
    (arguments,) = instructions_named(dockerfile, "HEALTHCHECK")
    _, arguments = without_flags(arguments)
    keyword, _, command = arguments.partition(" ")
    assert keyword == "CMD", f"{dockerfile.name}: HEALTHCHECK {arguments}"
    argv = exec_form(command.strip())
    assert argv, f"{dockerfile.name}: HEALTHCHECK CMD is not in exec form"
    return argv


def entrypoint(dockerfile: Path) -> list[str]:
    found = instructions_named(dockerfile, "ENTRYPOINT")
    return (exec_form(found[-1]) or []) if found else []


def shell_commands(dockerfile: Path) -> list[list[str]]:
    """The words of each simple command in the RUN instructions (split at `&&`, `;`, `|`, outside quotes)."""
    commands: list[list[str]] = []
    for run in instructions_named(dockerfile, "RUN"):
        lexer = shlex.shlex(run, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        command: list[str] = []
        for token in lexer:
            if token in ("&&", ";", "||", "|"):
                commands.append(command)
                command = []
            else:
                command.append(token)
        commands.append(command)
    return [command for command in commands if command]


def apt_packages(dockerfile: Path) -> set[str]:
    packages: set[str] = set()
    for words in shell_commands(dockerfile):
        if words[:2] == ["apt-get", "install"]:
            packages.update(word for word in words[2:] if not word.startswith("-"))
    return packages


def pip_installs(dockerfile: Path) -> list[list[str]]:
    """The arguments of every `pip install` (or `python -m pip install`) in the RUN instructions."""
    installs = []
    for words in shell_commands(dockerfile):
        if "pip" in words and words[words.index("pip") + 1 : words.index("pip") + 2] == ["install"]:
            installs.append(words[words.index("pip") + 2 :])
    return installs


def program_problem(dockerfile: Path, argv: list[str]) -> str | None:
    """Why `argv` would not start in the image built from `dockerfile`, or None when it would."""
    if argv and PurePosixPath(argv[0]).name == "tini":
        if "tini" not in apt_packages(dockerfile):
            return f"{argv[0]} is not installed by {dockerfile.name}"
        argv = argv[argv.index("--") + 1 :] if "--" in argv else argv[1:]
    if not argv:
        return "empty command"
    if argv[0] in CONSOLE_SCRIPTS:
        return None
    program = argv[1] if argv[0] in PYTHON_INTERPRETERS and len(argv) > 1 else argv[0]
    if image_file_source(dockerfile, program) is None:
        return f"{program!r} is neither a console script in pyproject.toml nor a file COPY'd into the image"
    return None


# --- reading the compose file ---------------------------------------------------------------------


def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def built_services() -> dict[str, tuple[dict, Path]]:
    """Services built from this repository, with the Dockerfile each one is built from."""
    services = {}
    for name, service in compose()["services"].items():
        if "build" in service:
            context = (COMPOSE_FILE.parent / service["build"]["context"]).resolve()
            services[name] = (service, context / service["build"].get("dockerfile", "Dockerfile"))
    return services


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def worker_services() -> dict[str, dict]:
    return {
        name: service for name, (service, dockerfile) in built_services().items() if dockerfile == WORKER_DOCKERFILE
    }


def cli_parser(console_script: str) -> argparse.ArgumentParser:
    """The argparse parser behind a console script as the images run it (the service, not a subcommand)."""
    module = {"minify-server": "minify_server.cli", "minify-worker": "minify_worker.service.rqworker"}[console_script]
    return pytest.importorskip(module).build_parser()


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) or `docker-compose` (v1), whichever this machine has; None if neither."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def run_compose_config(tmp_path: Path, environment: dict[str, str]) -> subprocess.CompletedProcess:
    command = compose_command()
    if command is None:
        pytest.skip("no docker compose / docker-compose binary on this machine")
    empty_env_file = tmp_path / "empty.env"  # a developer's docker/.env must not change the outcome
    empty_env_file.write_text("")
    env = {key: value for key, value in os.environ.items() if not key.startswith("MINIFY_")}
    return subprocess.run(
        [*command, "--env-file", str(empty_env_file), "-f", str(COMPOSE_FILE), "config"],
        capture_output=True,
        text=True,
        env={**env, **environment},
        timeout=60,
        check=False,
    )


# --- reading .dockerignore --------------------------------------------------------------------------


def dockerignore_regex(pattern: str) -> re.Pattern[str]:
    translated = ""
    for token in re.split(r"(\*\*/|\*\*|\*|\?)", pattern.strip("/")):
        translated += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
    return re.compile(translated)


def excluded_from_build_context(relative_path: str) -> bool:
    """Docker's rule: the last pattern matching the path, or any folder above it, decides."""
    parts = relative_path.split("/")
    prefixes = ["/".join(parts[: depth + 1]) for depth in range(len(parts))]
    excluded = False
    for line in DOCKERIGNORE.read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        regex = dockerignore_regex(pattern.removeprefix("!"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            excluded = not negated
    return excluded


def source_files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    return [
        path
        for path in source.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and not path.name.endswith(".pyc")
        and not any(part.endswith(".egg-info") for part in path.parts)
    ]


# --- resolving what `pip install .[server]` installs ----------------------------------------------


def requirement_closure(requirements: list[Requirement]) -> tuple[set[str], set[str]]:
    """Names of every distribution the requirements pull in, transitively through installed metadata.

    Returns (resolved, not_installed): a requirement whose distribution is not installed here cannot be
    followed further, so it is reported rather than guessed at.
    """
    resolved: set[str] = set()
    not_installed: set[str] = set()
    pending = [(requirement, frozenset()) for requirement in requirements]
    visited: set[tuple[str, frozenset[str]]] = set()
    while pending:
        requirement, active_extras = pending.pop()
        environments = [{**default_environment(), "extra": extra} for extra in active_extras | {""}]
        if requirement.marker and not any(requirement.marker.evaluate(env) for env in environments):
            continue
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in visited:
            continue
        visited.add(key)
        resolved.add(name)
        try:
            dependencies = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            not_installed.add(name)
            continue
        pending.extend((Requirement(dependency), frozenset(requirement.extras)) for dependency in dependencies)
    return resolved, not_installed


def extra_requirements(extra: str) -> list[Requirement]:
    """The project's own dependencies plus an extra's, with `minify[...]` self-references expanded."""
    project = PYPROJECT["project"]
    requirements = [Requirement(text) for text in project["dependencies"]]
    for text in project["optional-dependencies"][extra]:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) == canonicalize_name(project["name"]):
            for nested in sorted(requirement.extras):
                requirements.extend(extra_requirements(nested))
        else:
            requirements.append(requirement)
    return requirements


# --- the compose file -----------------------------------------------------------------------------


def test_compose_file_validates_against_the_compose_specification():
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    # The schema declares draft 2019-09 by an old URI that jsonschema does not recognize: name the draft.
    jsonschema.Draft201909Validator.check_schema(schema)
    validator = jsonschema.Draft201909Validator(schema)
    errors = sorted(validator.iter_errors(compose()), key=lambda error: list(error.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, error.path))}: {error.message}" for error in errors)


def test_docker_compose_accepts_the_compose_file(tmp_path):
    result = run_compose_config(tmp_path, {"MINIFY_TOKENS": "test-token"})
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert set(resolved["services"]) == set(compose()["services"])


def test_compose_refuses_to_start_without_tokens(tmp_path):
    result = run_compose_config(tmp_path, {})
    assert result.returncode != 0
    assert "MINIFY_TOKENS" in result.stderr


def test_compose_services_build_from_dockerfiles_that_exist():
    services = built_services()
    assert {dockerfile for _, dockerfile in services.values()} == set(DOCKERFILES)
    for name, (service, dockerfile) in services.items():
        assert dockerfile.is_file(), f"{name}: {dockerfile} does not exist"
        assert (COMPOSE_FILE.parent / service["build"]["context"]).resolve() == REPO, name


def test_workers_serve_exactly_the_job_queues():
    served: dict[str, str] = {}
    for name, service in worker_services().items():
        queues = option(service["command"], "--queues")
        assert queues, f"{name}: no --queues"
        for queue in queues.split(","):
            assert queue in JOB_QUEUES, f"{name}: queue {queue!r} is not one of {sorted(JOB_QUEUES)}"
            served[queue] = name
    assert set(served) == JOB_QUEUES


def test_only_the_cuda_worker_reserves_an_nvidia_gpu():
    for name, service in worker_services().items():
        devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        gpus = [device for device in devices if device["driver"] == "nvidia" and "gpu" in device["capabilities"]]
        assert bool(gpus) == ("cuda" in option(service["command"], "--queues").split(",")), name


def test_workers_mount_the_artifact_volume_at_the_servers_data_dir():
    # Jobs carry absolute paths under the server's data dir: a worker must see them at the same path.
    services = built_services()
    data_dirs = {
        option(service["command"], "--data-dir")
        for service, dockerfile in services.values()
        if dockerfile == SERVER_DOCKERFILE
    }
    (data_dir,) = data_dirs
    mounts = {}
    for name, (service, _) in services.items():
        mounts[name] = {
            source for source, target, *_ in (volume.split(":") for volume in service["volumes"]) if target == data_dir
        }
        assert mounts[name], f"{name}: nothing mounted at the server's data dir {data_dir}"
        assert service.get("environment", {}).get("MINIFY_DATA_DIR", data_dir) == data_dir, name
    (shared,) = {frozenset(sources) for sources in mounts.values()}
    assert shared <= set(compose()["volumes"]), "the artifact storage is a named volume"


def test_redis_persists_with_append_only_file_on_a_volume():
    redis = compose()["services"]["redis"]
    command = redis["command"]
    assert option(command, "--appendonly") == "yes"
    named_volumes = set(compose()["volumes"])
    assert any(volume.split(":")[0] in named_volumes and volume.split(":")[1] == "/data" for volume in redis["volumes"])


def test_every_service_has_a_healthcheck_and_a_restart_policy():
    for name, service in compose()["services"].items():
        assert service.get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
        assert service.get("restart") in ("always", "unless-stopped"), f"{name}: restart {service.get('restart')}"


def test_services_wait_for_a_healthy_redis():
    for name, service in compose()["services"].items():
        if name != "redis":
            assert service["depends_on"]["redis"]["condition"] == "service_healthy", name


def test_compose_commands_parse_with_the_real_command_line_parsers():
    for name, (service, _) in built_services().items():
        program, *arguments = service["command"]
        try:
            cli_parser(program).parse_args(arguments)
        except SystemExit:
            pytest.fail(f"{name}: {program} rejects {arguments}")


def test_every_service_redis_url_names_the_redis_service():
    for name, (service, _) in built_services().items():
        assert option(service["command"], "--redis-url") == "redis://redis:6379/0", name


def test_compose_commands_and_healthchecks_start_programs_that_exist_in_their_images():
    for name, (service, dockerfile) in built_services().items():
        command = entrypoint(dockerfile) + service["command"]
        assert program_problem(dockerfile, command) is None, f"{name}: {program_problem(dockerfile, command)}"
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD", f"{name}: healthcheck is not in exec form"
        assert program_problem(dockerfile, test[1:]) is None, f"{name}: {program_problem(dockerfile, test[1:])}"


# --- the Dockerfiles ------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_every_copy_source_exists_in_the_build_context(dockerfile):
    found = copies(dockerfile)
    assert found
    for copy in found:
        source = REPO / copy.source
        assert source.exists(), f"{dockerfile.name}: COPY {copy.source}: no such path in the repository"
        files = source_files(source)
        assert files, f"{dockerfile.name}: COPY {copy.source}: nothing to copy"
        ignored = [
            str(path.relative_to(REPO)) for path in files if excluded_from_build_context(str(path.relative_to(REPO)))
        ]
        assert not ignored, f"{dockerfile.name}: COPY {copy.source}: .dockerignore drops {ignored[:5]}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_cmd_entrypoint_and_healthcheck_start_programs_that_exist_in_the_image(dockerfile):
    (cmd,) = instructions_named(dockerfile, "CMD")
    argv = exec_form(cmd)
    assert argv, f"{dockerfile.name}: CMD is not in exec form"
    assert program_problem(dockerfile, entrypoint(dockerfile) + argv) is None, program_problem(
        dockerfile, entrypoint(dockerfile) + argv
    )
    health = healthcheck_command(dockerfile)
    assert program_problem(dockerfile, health) is None, program_problem(dockerfile, health)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_default_cmd_parses_with_the_real_command_line_parser(dockerfile):
    program, *arguments = exec_form(instructions_named(dockerfile, "CMD")[-1])
    try:
        cli_parser(program).parse_args(arguments)
    except SystemExit:
        pytest.fail(f"{dockerfile.name}: {program} rejects {arguments}")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_images_run_as_a_non_root_user(dockerfile):
    users = instructions_named(dockerfile, "USER")
    assert users and users[-1] not in ("root", "0"), f"{dockerfile.name}: runs as {users[-1:] or 'root'}"


def test_worker_image_reaps_children_with_tini():
    assert PurePosixPath(entrypoint(WORKER_DOCKERFILE)[0]).name == "tini"
    assert "tini" in apt_packages(WORKER_DOCKERFILE)


def test_worker_image_has_a_cpp_compiler_for_inductor():
    assert "g++" in apt_packages(WORKER_DOCKERFILE)


def test_worker_image_torch_satisfies_the_worker_extra():
    defaults = {}
    for argument in instructions_named(WORKER_DOCKERFILE, "ARG"):
        name, _, default = argument.partition("=")
        defaults[name] = default
    (base,) = instructions_named(WORKER_DOCKERFILE, "FROM")
    assert base.startswith("pytorch/pytorch:${TORCH_VERSION}-cuda${CUDA_VERSION}"), base
    (torch,) = [
        Requirement(text)
        for text in PYPROJECT["project"]["optional-dependencies"]["worker"]
        if Requirement(text).name == "torch"
    ]
    assert defaults["TORCH_VERSION"] in SpecifierSet(str(torch.specifier)), defaults["TORCH_VERSION"]


def test_worker_image_installs_the_worker_extra_with_torch_pinned_to_the_base_image():
    (install,) = pip_installs(WORKER_DOCKERFILE)
    constraint = option(install, "--constraint")
    assert constraint, "without a constraint pip could replace the base image's CUDA torch"
    assert [word for word in install if not word.startswith("-") and word != constraint] == [
        "/tmp/src[${MINIFY_EXTRAS}]"]
    extras = dict(argument.partition("=")[::2] for argument in instructions_named(WORKER_DOCKERFILE, "ARG"))
    assert extras["MINIFY_EXTRAS"] == "worker"
    optional = PYPROJECT["project"]["optional-dependencies"]
    assert "worker" in optional and "hlo" in optional, "the extras the image's build argument names"
    (writes_constraint,) = [words for words in shell_commands(WORKER_DOCKERFILE) if words[-2:] == [">", constraint]]
    assert "torch.__version__" in " ".join(writes_constraint), "the constraint must pin the torch in the image"


def test_server_image_installs_only_the_server_extra():
    installs = pip_installs(SERVER_DOCKERFILE)
    assert installs == [["/tmp/src[server]"]]


def test_server_install_set_contains_no_torch():
    resolved, not_installed = requirement_closure(extra_requirements("server"))
    assert "fastapi" in resolved and "uvicorn" in resolved  # the walk really followed the extra
    assert not resolved & TORCH_DISTRIBUTIONS, f"the server would install {sorted(resolved & TORCH_DISTRIBUTIONS)}"
    assert not not_installed, f"not installed here, so not followed: {sorted(not_installed)}"
