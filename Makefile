# Promesa: `make run` brings everything up on this machine; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Two pytest processes: this suite waits on sockets and subprocesses far more than on CPU.
PYTEST_WORKERS ?= 2

.PHONY: install run test clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/promesa up

test: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -p no:cacheprovider

clean:
	rm -rf $(VENV) instance *.egg-info
