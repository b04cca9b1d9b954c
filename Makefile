# Promesa: `make run` brings everything up on this machine; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
NODE_STAMP := node_modules/.installed-stamp
# Two pytest processes: this suite waits on sockets and subprocesses far more than on CPU.
PYTEST_WORKERS ?= 2

.PHONY: install browser run test clean

# One pip run: the service's promesa-receiver dependency is met by the SDK in sdk/, never by an index.
$(STAMP): pyproject.toml sdk/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./sdk -e '.[test]'
	touch $(STAMP)

# Node is only for the tests that run the published TypeScript verification snippet.
$(NODE_STAMP): package.json package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --no-audit --no-fund --loglevel=error && touch $(NODE_STAMP); \
	else \
		echo "npm not found: the TypeScript snippet tests will be skipped"; \
	fi

install: $(STAMP) $(NODE_STAMP)

# The browser tests drive Debian's Chromium (a test tool's own browser download cannot work everywhere).
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	else \
		echo "chromium not found: install it (Debian: apt-get install chromium) or the browser tests skip"; \
	fi

run: install
	$(BIN)/promesa up

test: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -p no:cacheprovider

clean:
	rm -rf $(VENV) node_modules instance *.egg-info
