# The two commands the README opens with: `make serve` and `make test`.
# Both set up .venv on first use (torch 2.13.0 CPU build first, so pip never pulls a CUDA build).
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: serve test test-fast demo lint setup browser gpu-wheels test-versions

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

# Debian's chromium for the dashboard's browser tests (Playwright drives it; no browser download).
browser:
	@test -x /usr/bin/chromium || { (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: browser tests will skip"; }

# Another port: `make serve PORT=8001` (or MINIFY_PORT=8001 in the environment).
serve: setup
	.venv/bin/minify-server $(if $(PORT),--port $(PORT))

# The seed program with inductor's injected relu compile error, minified offline.
demo: setup
	$(PY) examples/programs.py examples/
	.venv/bin/minify-worker minify examples/relu_cos.pt2 --config cpp.inject_relu_bug_TESTING_ONLY=compile_error --out out/demo

# Three pytest workers (pytest-xdist) on the 2-core box: much of a test's time is waiting (a
# service or a sandbox starting, a timeout running out, a designed sleep), and with two workers a
# quarter of the CPU sat idle; a third fills it (about 10% off the suite's time). Tests are dealt
# out one at a time (loadgroup); those marked xdist_group(name), and the modules
# tests/conftest.py lists for their costly fixtures, stay on one worker, one after another.
# docs/internals.md, "Tests", has the figures.
PYTEST_WORKERS ?= 3

# The venv and the browser are set up side by side (on a fresh CI machine: about 50 s of pip and
# 30 s of apt-get, one mostly unpacking wheels, the other fetching and unpacking packages).
# The machines' image sets PYTHONDONTWRITEBYTECODE=1: every interpreter the suite starts (some 900:
# services' workers, the client, captures, repro.py) compiled the repository's modules from source
# again, and every pytest run in a test rewrote its asserts again. Cleared for the run, the first
# import writes __pycache__ (git ignores it) and the rest read it: test_client_cli's 67 client runs
# 31.7 -> 27.2 CPU-s, measured twice each way (docs/internals.md, "Tests"). `test-torch-V` too.
WRITE_BYTECODE := PYTHONDONTWRITEBYTECODE=
test:
	$(MAKE) --no-print-directory -j2 setup browser
	.venv/bin/ruff check .
	$(WRITE_BYTECODE) .venv/bin/python -m pytest -q -ra -n $(PYTEST_WORKERS) --dist loadgroup

# The fast, pure tests alone (marked `fast`: no sandbox child, subprocess, compile, Redis or
# browser), in one process, for the loop of an edit; only the modules that mark some are collected
# (collecting the rest imports transformers, the server, ...: most of the time). docs/internals.md, "Tests".
test-fast: setup
	.venv/bin/python -m pytest -q -m fast -n 0 $$(grep -rl --include='test_*.py' 'pytest.mark.fast' tests)

lint: setup
	.venv/bin/ruff check .

# Wheels for a GPU machine (the device tool's machines: Python 3.12, torch 2.11 with CUDA, triton,
# numpy, pytest; nothing can be fetched there): what minify's service and tests need beside those
# (.whl/requirements.txt), and what an editable install of minify builds with, which pip takes only
# into its build environment (the image's torch wants setuptools<82), for `carry` (docs/bench.md,
# "On a GPU machine").
GPU_WHEEL_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
	manylinux_2_12_x86_64 manylinux2010_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64

define GPU_WHEEL_REQUIREMENTS
import tomllib
pyproject = tomllib.load(open("pyproject.toml", "rb"))
project, extras = pyproject["project"], pyproject["project"]["optional-dependencies"]
wanted = [*project["dependencies"], *extras["server"], *extras["worker"]]
wanted += [r for r in extras["dev"] if r.startswith(("pytest", "pyyaml", "jsonschema"))]
print("\n".join(r for r in wanted if not r.startswith(("torch", "numpy"))))
print("\n".join(pyproject["build-system"]["requires"]), file=open(".whl/build-requirements.txt", "w"))
endef
export GPU_WHEEL_REQUIREMENTS

gpu-wheels: $(STAMP)
	rm -rf .whl && mkdir .whl
	$(PY) -c "$$GPU_WHEEL_REQUIREMENTS" > .whl/requirements.txt
	$(PY) -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
		$(GPU_WHEEL_PLATFORMS:%=--platform %) -d .whl -r .whl/requirements.txt -r .whl/build-requirements.txt
	du -sh .whl

# The tests that reach into torch (real inductor and AOTInductor compiles, dynamo's hooks for
# capture, the compiler bisector for the culprit) on another supported torch, each in a venv of its
# own: `make test-torch-2.11` (our GPU machines' version), `make test-torch-2.14`, `make test-torch-2.15`
# (the newest).
# All are CUDA builds (2.14.1 about 5.5 GB, which these machines have on disk; 2.11.0 and 2.15.0
# are downloaded from PyPI, with their CUDA libraries), run on the CPU. torch goes in with --no-deps and
# everything else from a list without cuda-bindings (used only by CUDA green contexts and the CUPTI
# profiler). CI stays on .venv's 2.13 CPU; see docs/deploy.md, "Supported torch versions".
# Where a pip constraints file caps torch below the pin, lift it for that one install:
# `PIP_CONSTRAINT=/dev/null make .venv-torch-2.15/.installed` (an empty PIP_CONSTRAINT does not).
TORCH_PIN_2.11 := 2.11.0
TORCH_PIN_2.14 := 2.14.1
TORCH_PIN_2.15 := 2.15.0
TORCH_OTHER_TESTS := tests/worker/engine/test_engine_inductor.py tests/worker/programs/fx/test_run.py tests/worker/engine/test_engine.py \
	tests/worker/programs/fx/test_prepare.py tests/worker/programs/fx/test_graph.py tests/worker/engine/test_artifacts.py tests/contract/test_archive_code.py \
	tests/worker/programs/fx/test_control_flow.py tests/worker/programs/fx/test_dynamic_shapes.py tests/worker/test_oracle.py tests/worker/sandbox/test_sandbox.py \
	tests/client/capture/test_client_capture.py tests/client/capture/test_capture_plugin.py tests/worker/programs/fx/test_culprit.py tests/worker/programs/fx/test_bisector.py \
	tests/worker/engine/test_given_signature.py tests/contract/test_bug_key.py tests/worker/sandbox/test_gpu_safety.py \
	tests/client/capture/test_fidelity_training.py tests/client/capture/test_training_compile_errors.py \
	tests/worker/sandbox/test_warmup.py tests/worker/engine/test_hang_bound.py tests/client/capture/test_custom_ops.py \
	tests/worker/sandbox/test_failed_builds.py tests/worker/sandbox/test_vec_isa.py

# torch's requirements and minify's (server, worker, dev), less torch itself and cuda-bindings.
define TORCH_OTHER_REQUIREMENTS
import tomllib
from importlib.metadata import requires
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = [*project["dependencies"], *(r for extra in ("server", "worker", "dev") for r in project["optional-dependencies"][extra])]
wanted += [r for r in requires("torch") if "extra ==" not in r]
print("\n".join(r for r in wanted if not r.startswith(("minify[", "torch", "cuda-bindings"))))
endef
export TORCH_OTHER_REQUIREMENTS

.PRECIOUS: .venv-torch-%/.installed  # a stamp, not an intermediate file for make to delete

.venv-torch-%/.installed: pyproject.toml
	@test -n "$(TORCH_PIN_$*)" || { echo "no pin for torch $*: add TORCH_PIN_$* to the Makefile"; exit 2; }
	test -x .venv-torch-$*/bin/python || python3 -m venv .venv-torch-$*
	.venv-torch-$*/bin/python -m pip install -q --upgrade pip
	.venv-torch-$*/bin/python -m pip install -q --no-deps "torch==$(TORCH_PIN_$*)"
	.venv-torch-$*/bin/python -c "$$TORCH_OTHER_REQUIREMENTS" > .venv-torch-$*/requirements.txt
	.venv-torch-$*/bin/python -m pip install -q -r .venv-torch-$*/requirements.txt
	.venv-torch-$*/bin/python -m pip install -q --no-deps -e .
	touch $@

# The version phase on real releases, not part of `make test` (three more multi-GB venvs): a job
# minimized on .venv's 2.13 probes repro.py on 2.11, 2.14 and 2.15 (MINIFY_TORCH_ENVS), offline and
# through a service's RQ workers (tests/worker/service/test_versions_releases.py).
VERSION_RELEASES := 2.11 2.14 2.15
test-versions: $(VERSION_RELEASES:%=.venv-torch-%/.installed)
	MINIFY_TEST_TORCH_RELEASES="$(VERSION_RELEASES:%=.venv-torch-%)" .venv/bin/python -m pytest -q -ra \
		-p no:cacheprovider tests/worker/service/test_versions_releases.py

test-torch-%: .venv-torch-%/.installed
	.venv-torch-$*/bin/python -c "import torch; assert torch.__version__.startswith('$*.'), torch.__version__"
	$(WRITE_BYTECODE) .venv-torch-$*/bin/python -m pytest -q -ra -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadgroup $(TORCH_OTHER_TESTS)
