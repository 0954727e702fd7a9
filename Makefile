# The two commands the README promises, plus the checks CI runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: serve test check lint typecheck suite unit slow e2e quick bench proto clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Serve the bundled example repository (CPU): HTTP :8000, gRPC :8001, shm clients allowed.
serve: $(PY)
	$(PY) -m pip install -q -e .
	$(VENV)/bin/conveyor serve --allow-client-shm=true

# Install what the tests need, then lint, type-check and run the whole suite.
test: $(PY)
	$(PY) -m pip install -q -e '.[test,vllm]'
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec  # built for another torch (pyproject: vllm)
	$(PY) -m pip uninstall -q -y triton  # xgrammar's, for GPUs: 1 GB that vLLM's CPU build does not use (no CPU backend in it)
	CONVEYOR_REQUIRE_VLLM=1 $(MAKE) check  # the vLLM tests fail, not skip, if the engine did not install

check: lint typecheck suite

# ruff, then the import contracts (pyproject.toml, [tool.importlinter]): no cycles, the actors independent.
lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# mypy finds conveyor.* in build/src, the links an install makes (pyproject.toml), as editors and other tools do.
typecheck:
	$(VENV)/bin/mypy -p conveyor -p tests

# The whole suite: every level.
suite:
	$(PY) -m pytest -q --durations=25  # the slowest tests named in CI's log: where suite time goes

# One level alone (each test module states its LEVEL; tests/conftest.py says what each means).
# unit: under a minute, no process started (refused), fuzz targets at a tenth of their cases: a check while
# editing; CI runs the whole suite.
unit:
	$(PY) -m pytest -q -m unit

slow:
	$(PY) -m pytest -q -m slow

e2e:
	$(PY) -m pytest -q -m e2e

quick: unit  # the unit level's former name

bench: $(PY)
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m conveyor.deploy.benchmarks.perf

proto: $(PY)
	$(PY) -m pip install -q -e '.[dev]'
	PATH=$(VENV)/bin:$$PATH bash proto/regenerate.sh

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
