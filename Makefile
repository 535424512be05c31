# The whole set-up: `make demo` and `make test`. Needs only python3 (3.11+), pip, make and git.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install bytecode demo test test-fast bench chaos clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@$(MAKE) --no-print-directory bytecode
	@touch $(STAMP)

# What pip does for a regular install and not for an editable one. The workflow sandbox (the
# replays run in it) imports each workflow module afresh for every workflow run: without bytecode
# (and with PYTHONDONTWRITEBYTECODE set, as on CI) every run recompiles its module from source.
bytecode:
	@$(PY) -m compileall -q activities substrate worker workflows bench

# Options pass through: make demo DEMO_ARGS='--keep --ui-port 8233' (`conductor demo --help` lists them).
demo: $(STAMP)
	$(VENV)/bin/conductor demo $(DEMO_ARGS)

# Two workers, each with its own session servers, a test file kept on one (TEST_WORKERS=0: one
# process, as `pytest` alone runs).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The pure tests only (no server, substrate or process; tests/conftest.py marks them), with short
# property searches: seconds, for the edit-test loop. `make test` is what CI runs.
test-fast: $(STAMP)
	CONDUCTOR_PROPERTY_EXAMPLES=10 $(PY) -m pytest -q -m "pure and not slow" $(PYTEST_ARGS)

BENCHMARKS := admission_engine admission_throughput admission_sustained admission_carried ledger_fold mission_fanout admission_holders

bench: $(STAMP) bytecode
	@for b in $(BENCHMARKS); do echo "== bench.$$b"; $(PY) -m bench.$$b || exit 1; done

# The full chaos suite (about 3 minutes); `make test` runs its short form.
chaos: $(STAMP) bytecode
	$(PY) -m bench.chaos

clean:
	rm -rf $(VENV) .conductor .pytest_cache
