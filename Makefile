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

.PHONY: install test test-faults test-compat lock test-compiled bench-compiled compiled lint demo bench redis-server wheel-smoke clean \
  bench-admission bench-bursts bench-routing bench-backpressure bench-cost bench-overhead bench-replicas

# LiteLLM's [proxy] extra, taken apart: from 1.109 it requires `litellm-proxy`, which this package index lacks,
# and pins `litellm-enterprise` and `litellm-proxy-extras` releases newer than the index has (1.110.2 asks
# 0.1.83.post1 and 0.4.114.post1; the newest here are 0.1.83 and 0.4.110), so `pip install 'litellm[proxy]'`
# fails here. Every pin is installed the same way instead: litellm (through '.[dev]'), then the extra's other
# requirements read from the installed litellm's metadata (.ci/proxy_extra_requirements.py), less
# PROXY_EXTRA_LEAVE_OUT, with any version of PROXY_EXTRA_ANY_VERSION (the constraints file pins the release
# that resolved here). On a LiteLLM whose pins the index has, this installs what litellm[proxy] installs.
# (litellm-proxy-extras holds the database migrations: a proxy without a database, as tested here, never
# imports it.)
PROXY_EXTRA_LEAVE_OUT ?= litellm-proxy
PROXY_EXTRA_ANY_VERSION ?= litellm-enterprise litellm-proxy-extras
PROXY_EXTRA_ARGS = $(addprefix --leave-out ,$(PROXY_EXTRA_LEAVE_OUT)) $(addprefix --any-version ,$(PROXY_EXTRA_ANY_VERSION))

$(STAMP): pyproject.toml $(CONSTRAINTS) .ci/proxy_extra_requirements.py
	$(PYTHON) -m venv $(VENV)
	# A pinned setuptools in the venv builds the package (no build isolation, which would take the newest
	# release: its 'compat' editable mode is marked for removal) and `make compiled` (setup.py).
	$(PY) -m pip install -q --upgrade pip 'setuptools==84.2.1'
	# compat mode: a plain path entry, so `import litellm_ratebalance` works from any directory (the proxy
	# imports callbacks with its config file's directory as the working directory).
	$(PY) -m pip install -q -c $(CONSTRAINTS) --no-build-isolation --config-settings editable_mode=compat \
	  -e '.[dev]'
	$(PY) .ci/proxy_extra_requirements.py $(PROXY_EXTRA_ARGS) > $(VENV)/litellm-proxy-extra.txt
	$(PY) -m pip install -q -c $(CONSTRAINTS) -r $(VENV)/litellm-proxy-extra.txt
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

# The same suite on the other supported LiteLLM releases, each in its own venv (.venv-<pin>): the newest
# installable here and the newest whose unsplit [proxy] extra still installs.
COMPAT_PINS ?= 1.110.2 1.108.5
# (every pin runs, then the target fails if any did)
test-compat:
	@failed=""; for pin in $(COMPAT_PINS); do echo "== LiteLLM $$pin"; \
	  $(MAKE) --no-print-directory test LITELLM_PIN=$$pin VENV=.venv-$$pin || failed="$$failed $$pin"; done; \
	  if [ -n "$$failed" ]; then echo "test-compat failed on LiteLLM$$failed"; exit 1; fi

# A constraints file from a fresh resolve: `make lock LITELLM_PIN=X` writes constraints/litellm-X.txt with
# litellm==X, its [proxy] extra as `make install` takes it apart, and this package's dev extra, resolved
# together in a scratch venv (build/lock-venv).
LOCK_VENV := build/lock-venv
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip 'setuptools==84.2.1'
	$(LOCK_VENV)/bin/python -m pip install -q --no-deps 'litellm==$(LITELLM_PIN)' packaging
	$(LOCK_VENV)/bin/python .ci/proxy_extra_requirements.py $(PROXY_EXTRA_ARGS) > $(LOCK_VENV)/litellm-proxy-extra.txt
	$(LOCK_VENV)/bin/python -m pip install -q --no-build-isolation -e '.[dev]' 'litellm==$(LITELLM_PIN)' \
	  -r $(LOCK_VENV)/litellm-proxy-extra.txt
	$(LOCK_VENV)/bin/python -m pip freeze --exclude-editable > constraints/litellm-$(LITELLM_PIN).txt
	rm -rf $(LOCK_VENV)

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
	$(VENV)/bin/ruff check litellm_ratebalance tests bench setup.py .ci/wheel_smoke.py .ci/proxy_extra_requirements.py
	$(VENV)/bin/ruff format --check litellm_ratebalance tests bench setup.py .ci/wheel_smoke.py \
	  .ci/proxy_extra_requirements.py
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy .ci/wheel_smoke.py .ci/proxy_extra_requirements.py

# `make demo` runs on the embedded store; `make demo REPLICAS=2` adds a throwaway local redis-server and a
# second proxy replica.
REPLICAS ?= 1
demo: $(STAMP)
	@if [ "$(REPLICAS)" != 1 ]; then $(MAKE) --no-print-directory redis-server; fi
	$(PY) -m litellm_ratebalance.demo --replicas $(REPLICAS) $(DEMO_ARGS)

bench: $(STAMP) redis-server
	$(PY) bench/run_all.py $(BENCH_ARGS)

# The figures of README.md and docs/, one target per bench, each run with the arguments the figures were
# measured with (bench/results/ holds the runs; a script's --write writes its results file again).
bench-admission: $(STAMP) redis-server
	PYTHONPATH=. $(PY) bench/bench_admission.py --seed 1
bench-bursts: $(STAMP) redis-server
	PYTHONPATH=. $(PY) bench/bench_bursts.py --runs 10
bench-routing: $(STAMP)
	PYTHONPATH=. $(PY) bench/bench_routing.py --seeds 1 2 3 4 5 6 7 8 --duration 12 --no-proxy \
	  --strategies ours least-busy latency-based-routing simple-shuffle usage-based-routing-v2 oracle
bench-backpressure: $(STAMP)
	PYTHONPATH=. $(PY) bench/bench_backpressure.py --seed 7
bench-cost: $(STAMP)
	PYTHONPATH=. $(PY) bench/bench_cost.py
bench-replicas: $(STAMP) redis-server
	for n in 1 2 3; do PYTHONPATH=. $(PY) bench/bench_backpressure.py --profile kv --replicas $$n --seed 7 --seconds 100 || exit 1; done
bench-overhead: $(STAMP) redis-server
	PYTHONPATH=. $(PY) bench/bench_proxy_overhead.py --rounds 4 --seconds 8

clean:
	rm -rf $(VENV) .venv-* .pytest_cache .mypy_cache .ruff_cache build
