# The two commands the README opens with: `make serve` and `make test`.
# Both set up .venv on first use (torch 2.13.0 CPU build first, so pip never pulls a CUDA build).
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: serve test demo lint setup browser test-torch-2.14

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

serve: setup
	.venv/bin/minify-server

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
test:
	$(MAKE) --no-print-directory -j2 setup browser
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -q -ra -n $(PYTEST_WORKERS) --dist loadgroup

lint: setup
	.venv/bin/ruff check .

# The engine's torch-facing tests (real inductor compiles) on the newest supported torch, in a
# second venv. torch 2.14.1 is a CUDA build (about 5.5 GB) that these machines have on disk, but
# not its cuda-bindings requirement (used only by CUDA green contexts and the CUPTI profiler), so
# torch goes in with --no-deps and everything else from a list without it: nothing is downloaded
# for torch. CI stays on .venv's 2.13 CPU; see docs/deploy.md, "Supported torch versions".
TORCH_NEXT_VENV := .venv-torch-2.14
TORCH_NEXT_PY := $(TORCH_NEXT_VENV)/bin/python
TORCH_NEXT_TESTS := tests/test_engine_inductor.py tests/test_runner.py tests/test_engine.py \
	tests/test_loader.py tests/test_graph.py tests/test_artifacts.py tests/test_archive_code.py \
	tests/test_control_flow.py tests/test_dynamic_shapes.py tests/test_oracle.py tests/test_sandbox.py

# torch's requirements and minify's (server, worker, dev), less torch itself and cuda-bindings.
define TORCH_NEXT_REQUIREMENTS
import tomllib
from importlib.metadata import requires
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = [*project["dependencies"], *(r for extra in ("server", "worker", "dev") for r in project["optional-dependencies"][extra])]
wanted += [r for r in requires("torch") if "extra ==" not in r]
print("\n".join(r for r in wanted if not r.startswith(("minify[", "torch", "cuda-bindings"))))
endef
export TORCH_NEXT_REQUIREMENTS

$(TORCH_NEXT_VENV)/.installed: pyproject.toml
	test -x $(TORCH_NEXT_PY) || python3 -m venv $(TORCH_NEXT_VENV)
	$(TORCH_NEXT_PY) -m pip install -q --upgrade pip
	$(TORCH_NEXT_PY) -m pip install -q --no-deps "torch==2.14.1"
	$(TORCH_NEXT_PY) -c "$$TORCH_NEXT_REQUIREMENTS" > $(TORCH_NEXT_VENV)/requirements.txt
	$(TORCH_NEXT_PY) -m pip install -q -r $(TORCH_NEXT_VENV)/requirements.txt
	$(TORCH_NEXT_PY) -m pip install -q --no-deps -e .
	touch $@

test-torch-2.14: $(TORCH_NEXT_VENV)/.installed
	$(TORCH_NEXT_PY) -c "import torch; assert torch.__version__.startswith('2.14.'), torch.__version__"
	$(TORCH_NEXT_PY) -m pytest -q -ra -p no:cacheprovider $(TORCH_NEXT_TESTS)
