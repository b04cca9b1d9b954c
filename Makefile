# Promesa: `make run` brings everything up on this machine; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
NODE_STAMP := node_modules/.installed-stamp
# Two pytest processes: this suite waits on sockets and subprocesses far more than on CPU.
PYTEST_WORKERS ?= 2

.PHONY: install install-run browser run test dist screenshots clean

# The service alone: its promesa-receiver dependency is met by the SDK in sdk/, never by an index.
# constraints.txt pins every other package to the version CI tested, so what is tested is what is deployed.
$(RUN_STAMP): pyproject.toml sdk/pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ./sdk -e .
	touch $(RUN_STAMP)

# The tests add their tools, the bench's extra and the producer client they exercise.
$(TEST_STAMP): $(RUN_STAMP) sdk/producer/pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ./sdk -e ./sdk/producer -e '.[test,bench]'
	touch $(TEST_STAMP)

# Node is only for the tests that run the published TypeScript verification snippet.
$(NODE_STAMP): package.json package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --no-audit --no-fund --loglevel=error && touch $(NODE_STAMP); \
	else \
		echo "npm not found: the TypeScript snippet tests will be skipped"; \
	fi

install-run: $(RUN_STAMP)

install: $(TEST_STAMP) $(NODE_STAMP)

# The browser tests drive Debian's Chromium (a test tool's own browser download cannot work everywhere).
# apt waits up to five minutes for a dpkg lock another apt run holds, instead of failing at once.
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get -o DPkg::Lock::Timeout=300 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends chromium; \
	else \
		echo "chromium not found: install it (Debian: apt-get install chromium) or the browser tests skip"; \
	fi

run: install-run
	$(BIN)/promesa up

test: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -p no:cacheprovider

# An sdist and a wheel of each distribution, each at the version its own pyproject.toml names: the server
# (templates, static files and migrations inside), the receiver SDK and the producer client (docs/deploying.md).
dist: $(TEST_STAMP)
	rm -rf dist
	for project in . sdk sdk/producer; do $(BIN)/python -m build --quiet --outdir dist $$project || exit 1; done
	@ls -1 dist

# The README's pictures (docs/*.png): demo data on SQLite + embedded Redis, shot with Debian's chromium.
screenshots: install browser
	$(BIN)/python docs/screenshots.py

clean:
	rm -rf $(VENV) node_modules instance dist *.egg-info sdk/*.egg-info sdk/producer/*.egg-info
