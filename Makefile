# Two commands for a newcomer: `make run` and `make test`. Nothing else is needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?= ops/queues.example.toml

.PHONY: run test install install-test lint docs bench clean compile pure

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .

install-test: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,spark,docs]'

run: install
	$(BIN)/kq serve --config $(CONFIG)

# Test files run side by side, one file per worker (each worker starts its own brokers), the
# slowest files first (tests/conftest.py). Most tests wait on Kafka (group sessions, leases,
# restarts) rather than compute: three workers keep two cores busy, where two left a third
# of them idle. Every test that talks to a broker runs twice: on the embedded broker and on
# Apache Kafka (Java 17 and Maven; skipped with the reason where they are missing, a failure
# in CI). The 30 slowest tests are listed at the end: the suite must stay under 30 minutes.
# Then the compiled tier: the unit suite and the clients' end-to-end tests again with the hot
# modules compiled by mypyc (a C compiler and Python's headers; said and skipped where
# missing, a failure in CI).
test: install-test docs lint pure
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=30
	$(BIN)/python ops/compile.py --test

# kq's hot modules compiled with mypyc, in place (broker/compiled.py lists them); `make pure`
# removes the build, and kq runs as Python again.
compile: install-test
	$(BIN)/python ops/compile.py

pure: install
	$(BIN)/python ops/compile.py --clean

lint: install-test
	$(BIN)/ruff check broker cli tests ops
	$(BIN)/mypy broker cli
	$(BIN)/mypy --explicit-package-bases ops

# The documentation site, into site/: strict, so a broken link or a missing page fails it.
# The configuration and CLI references are generated from the code as it builds.
docs: install-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

bench: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python ops/bench.py

clean:
	rm -rf $(VENV) kq-data .pytest_cache .hypothesis site build *__mypyc*.so
	find broker -name '*.so' -delete
