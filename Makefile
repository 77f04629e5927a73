# Two commands matter: `make run` and `make test`. Both work on a fresh machine: they create the
# virtualenv, install pinned (hashed) dependencies, generate the gRPC code, then do their job.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SRC_DIRS := libs/crm-proto/src libs/crmkit/src libs/crmstack/src $(wildcard services/*/src)
PROTO_FILES := $(shell find proto -name '*.proto')
PROTO_OUT := libs/crm-proto/src
STAMP := $(VENV)/.installed

UV ?= uv
IMAGE_TAG ?= dev

.PHONY: install proto run stop test lint typecheck unit integration clean chromium \
	requirements images container-test kind-test chart-check images-check bench bench-smoke fuzz \
	bench-scale bench-peer

install: $(STAMP)

$(STAMP): requirements/dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing pinned dependencies into $(VENV) (first run takes a minute or two)"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --require-hashes -r requirements/dev.txt
	@site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  for dir in $(SRC_DIRS); do echo "$(CURDIR)/$$dir"; done > "$$site/crm-dev.pth"
	@touch $(STAMP)

proto: $(PROTO_OUT)/crm/.generated

$(PROTO_OUT)/crm/.generated: $(PROTO_FILES) $(STAMP)
	@rm -rf $(PROTO_OUT)/crm && mkdir -p $(PROTO_OUT)
	proto/generate.sh $(PY) $(PROTO_OUT) --pyi_out=$(PROTO_OUT) \
	  --plugin=protoc-gen-mypy_grpc=$(VENV)/bin/protoc-gen-mypy_grpc --mypy_grpc_out=$(PROTO_OUT)
	@touch $(PROTO_OUT)/crm/py.typed $(PROTO_OUT)/crm/.generated

run: install proto
	$(PY) -m crmstack run

# Stops the stack `make run` started from this checkout, from any terminal.
stop:
	@if [ -x $(PY) ]; then $(PY) -m crmstack stop; else echo "no CRM stack to stop (no $(VENV))"; fi

lint: install proto
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest tests/test_import_cycles.py -q

typecheck: install proto
	$(VENV)/bin/mypy

unit: install proto
	$(PY) -m pytest libs services -q

# The integration suite in two pytest-xdist processes, each with its own stacks, a file whole on
# one worker: 13:38 against 18:05 on a 2-core VM. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
integration: install proto chromium
	$(PY) -m pytest tests/integration -q --durations=15 -n $(TEST_WORKERS) --dist loadfile

# The OAuth consent page is tested in headless Chromium (Debian's package, driven by Playwright);
# install it when missing and apt-get is usable, otherwise those tests skip saying why.
chromium:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's chromium for the OAuth consent-page tests"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -qq chromium >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; } || \
	  echo "chromium could not be installed: the consent-page tests will skip"; \
	else echo "chromium is missing and apt-get is not usable here: the consent-page tests will skip"; fi

# The chart rendered offline (helm-python-sdk), schema-checked and asserted; the image inputs.
chart-check: install proto
	$(PY) -m pytest tests/chart -q

images-check: install proto
	$(PY) -m pytest tests/images -q

# The integration suite runs last so that the run closes on pytest's summary line (CI reads it).
test: lint typecheck unit chart-check images-check bench-smoke integration

# The benchmark suite (bench/README.md): its own stack, a seeded data set (130k records), every
# workload beside its PostgreSQL floor; table and JSON in bench/results/. Minutes; never in `test`.
bench: install proto
	$(PY) bench/run.py $(BENCH_ARGS)

# The project beside Directus 12.4 in one run (issue 18's ratios and budgets): the peer harness in
# shared/peers installs Directus from the npm registry (minutes the first time); wrk, 20 s per
# workload; never in `test`. PEER_ARGS="--seconds 10" or "--no-peer".
bench-peer: install proto
	$(PY) bench/peer.py $(PEER_ARGS)

# Costs as the stack grows to 1,000 workspaces and 1,000,000 rows (issue #27's table, with
# budgets); long, for a quiet machine; never in `test`. SCALE_ARGS="--workspaces 50 --rows 50000".
bench-scale: install proto
	$(PY) bench/bench_scale.py $(SCALE_ARGS)

# The same code in seconds (tiny data set, few iterations, budgets not judged): part of `test`,
# so the benchmarks cannot rot.
bench-smoke: install proto
	$(PY) bench/run.py --smoke

# The property-based tests with a longer profile (FUZZ_EXAMPLES per test; `test` runs a short
# one): its own stack, minutes; never in `test`.
fuzz: install proto
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-2000} $(PY) -m pytest tests/integration/test_input_fuzz.py \
	  tests/integration/test_graphql_fuzz.py tests/integration/test_records_oracle.py -q

# The hashed requirement files: requirements/dev.txt, requirements/proto.txt and one per image
# (services/<name>/requirements.txt), compiled with uv (`make requirements UV=/path/to/uv`).
requirements:
	PYTHONPATH=libs/crmstack/src $(PYTHON) -m crmstack.requirements --uv $(UV)

# One image per service, crm-<service>:$(IMAGE_TAG), from deploy/images/Dockerfile: with Docker
# where an engine answers, else podman/buildah (installed when missing and apt-get is usable).
images: install
	$(PY) -m crmstack.deploy images --tag $(IMAGE_TAG)

# The chart's manifests (ci/container-values.yaml) as podman containers on a private network,
# then tests/containers and tests/integration through a port on 127.0.0.1; always torn down.
container-test: install proto
	$(PY) -m crmstack.podstack $(PYTEST_ARGS)

# A kind cluster: images, infrastructure, the chart, then tests/integration through a
# port-forward; the cluster is deleted afterwards unless KEEP_CLUSTER=1. Needs Docker and kind.
kind-test: install proto
	$(PY) -m crmstack.deploy kind-test

clean:
	rm -rf $(VENV) $(PROTO_OUT)/crm .mypy_cache .ruff_cache .pytest_cache
