# The two commands the README opens with: `make serve` and `make test`.
# Both set up .venv on first use (torch 2.13.0 CPU build first, so pip never pulls a CUDA build).
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: serve test demo lint setup browser

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

test: setup browser
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -q -ra

lint: setup
	.venv/bin/ruff check .
