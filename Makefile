# Two commands on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: serve test lint bench screenshot clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.run-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.run-installed

$(VENV)/.bench-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@ $(VENV)/.test-installed $(VENV)/.run-installed

serve: $(VENV)/.run-installed  # (make's own variables kept out of the sessions' environment)
	env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS $(BIN)/ttyserve serve $(ARGS)

lint: $(VENV)/.test-installed
	$(BIN)/ruff check ttyserve tests benchmarks scripts
	$(BIN)/mypy --strict ttyserve

# The suite runs on two processes (pytest-xdist): every server test runs once per worker count.
PYTEST_ARGS ?= -n 2

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The browser terminal's picture in the README, taken by the browser test harness (needs chromium).
screenshot: $(VENV)/.test-installed
	TTYSERVE_SCREENSHOT=docs/images/browser-terminal.png $(BIN)/python -m pytest -q \
		tests/browser/test_page.py -k keys_reach

# The benchmark suite (benchmarks/README.md): `make bench ARGS="--quick"` for a smoke run.
bench: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.run $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
