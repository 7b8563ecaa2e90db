# Every target does its own set-up: a fresh clone needs nothing but python3 (and root or sudo for apt-get
# when redis-server is missing).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
LITELLM_PIN ?= 1.106.12
CONSTRAINTS ?= constraints/litellm-$(LITELLM_PIN).txt
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(LITELLM_PIN)
export LITELLM_LOCAL_MODEL_COST_MAP := True
export PYTHONUNBUFFERED := 1

.PHONY: install test test-faults test-compat test-compiled bench-compiled compiled lint demo bench redis-server wheel-smoke clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	# A pinned setuptools in the venv builds the package (no build isolation, which would take the newest
	# release: its 'compat' editable mode is marked for removal) and `make compiled` (setup.py).
	$(PY) -m pip install -q --upgrade pip 'setuptools==84.2.1'
	# compat mode: a plain path entry, so `import litellm_ratebalance` works from any directory (the proxy
	# imports callbacks with its config file's directory as the working directory).
	$(PY) -m pip install -q -c $(CONSTRAINTS) --no-build-isolation --config-settings editable_mode=compat \
	  -e '.[dev,proxy]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

# redis-server is a system package; install it only when it is missing.
redis-server:
	@command -v redis-server >/dev/null || { \
	  echo "redis-server not found: installing it with apt-get"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server; }

# The test session starts its own throwaway redis-server (and Redis Cluster) on free loopback ports and
# stops them at the end (tests/conftest.py). pytest's exit code 5 means "no tests collected".
# A bare `pytest` on a machine without redis-server runs the store suites on fakeredis and skips what needs
# the real server; `make test` (and CI) installs redis-server and, with this variable, fails such a test
# instead of skipping it. `make test REQUIRE_REDIS_SERVER=0` allows the skips.
REQUIRE_REDIS_SERVER ?= 1
export LITELLM_RATEBALANCE_REQUIRE_REDIS_SERVER := $(REQUIRE_REDIS_SERVER)
# The fault tests (tests/faults, marker `faults`: proxies, Redis processes, Sentinel) are left out here and run
# by `make test-faults` (a later -m in PYTEST_ARGS wins).
NOT_FAULTS := -m 'not faults'
test: $(STAMP) redis-server
	@set +e; $(PY) -m pytest -q -p no:cacheprovider $(NOT_FAULTS) $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

# Crashes, slow and full Redis, cluster resharding, Sentinel failover, under load (needs redis-sentinel too).
test-faults: $(STAMP) redis-server
	@command -v redis-sentinel >/dev/null || { \
	  echo "redis-sentinel not found: installing it with apt-get"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-sentinel; }
	$(PY) -m pytest -q -p no:cacheprovider -m faults $(PYTEST_ARGS)

# The same suite against the newest LiteLLM whose [proxy] extra installs here, in its own venv.
COMPAT_PIN ?= 1.108.5
test-compat:
	$(MAKE) test LITELLM_PIN=$(COMPAT_PIN) VENV=.venv-$(COMPAT_PIN)

# The routing core compiled with mypyc (setup.py names the modules), in a copy of the tracked files (of
# the source tree, less build outputs and venvs, outside a git checkout, e.g. an unpacked tarball): a
# compiled module next to its source would shadow every later edit of it in this checkout. `make
# test-compiled` runs the whole suite against it, `make bench-compiled` the decision-cost bench.
COMPILED_DIR ?= build/compiled
compiled: $(STAMP)
	rm -rf $(COMPILED_DIR) && mkdir -p $(COMPILED_DIR)
	if [ "$$(git rev-parse --show-toplevel 2>/dev/null)" = "$(CURDIR)" ]; then \
	  git ls-files -z | xargs -0 cp --parents -t $(COMPILED_DIR); \
	else \
	  tar -cf - --exclude=./build --exclude='./.venv*' --exclude=__pycache__ --exclude='*.so' . \
	    | tar -xf - -C $(COMPILED_DIR); \
	fi
	cd $(COMPILED_DIR) && LITELLM_RATEBALANCE_COMPILE=1 $(CURDIR)/$(PY) setup.py -q build_ext --inplace \
	  >mypyc.log 2>&1 || { tail -40 mypyc.log; exit 1; }
	cd $(COMPILED_DIR) && $(CURDIR)/$(PY) -c 'from litellm_ratebalance.routing import core_build; \
	  assert core_build() == "compiled", "the routing modules did not load compiled"'

test-compiled: compiled redis-server
	@cd $(COMPILED_DIR) && set +e; LITELLM_RATEBALANCE_EXPECT_CORE=compiled $(CURDIR)/$(PY) -m pytest -q -p no:cacheprovider $(NOT_FAULTS) $(PYTEST_ARGS); \
	  rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

bench-compiled: compiled
	cd $(COMPILED_DIR) && $(CURDIR)/$(PY) bench/bench_routing_decision.py

# The package as a user gets it: sdist and wheel built, the wheel installed into a fresh venv with only the
# pinned litellm[proxy], `litellm --config` on the example config (mock deployments, embedded store), our
# series on /metrics, `litellm-ratebalance check-config` (.ci/wheel_smoke.py says what is checked).
wheel-smoke: $(STAMP)
	$(PY) .ci/wheel_smoke.py --constraints $(CONSTRAINTS) --litellm $(LITELLM_PIN)

lint: $(STAMP)
	$(VENV)/bin/ruff check litellm_ratebalance tests bench setup.py .ci/wheel_smoke.py
	$(VENV)/bin/ruff format --check litellm_ratebalance tests bench setup.py .ci/wheel_smoke.py
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy .ci/wheel_smoke.py

# `make demo` runs on the embedded store; `make demo REPLICAS=2` adds a throwaway local redis-server and a
# second proxy replica.
REPLICAS ?= 1
demo: $(STAMP)
	@if [ "$(REPLICAS)" != 1 ]; then $(MAKE) --no-print-directory redis-server; fi
	$(PY) -m litellm_ratebalance.demo --replicas $(REPLICAS) $(DEMO_ARGS)

bench: $(STAMP) redis-server
	$(PY) bench/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-* .pytest_cache .mypy_cache .ruff_cache build
