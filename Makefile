# Every target installs what it needs: uv (if missing), the locked Python dependencies,
# Debian's redis-server and the pinned Go-built programs (cached outside the repo).
SHELL := /bin/bash
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
RUN := $(UV) run --frozen

.PHONY: all install tools demo test test-unit test-integration lint fmt crds rbac bench soak outage clean

all: lint test

$(UV):
	@echo "[capibus] installing uv"
	@python3 -m pip install --quiet --user uv

install: $(UV)
	@$(UV) sync --frozen

tools:
	@bash testenv/build.sh

demo: install tools
	@$(RUN) python -m demo $(if $(SCENE),--scene $(SCENE))

test: install tools lint
	@$(RUN) pytest

test-unit: install
	@$(RUN) pytest tests/unit

test-integration: install tools
	@$(RUN) pytest tests/integration

lint: install
	@$(RUN) ruff check .
	@$(RUN) ruff format --check .
	@$(RUN) mypy
	@$(RUN) lint-imports
	@$(RUN) python -m shared.crdgen --check deploy/crds
	@$(RUN) python -m services rbac --check deploy/chart/capibus/files/rbac --doc docs/permissions.md
	@$(RUN) python -m services access --check deploy/chart/capibus/files/access.json --doc docs/permissions.md

fmt: install
	@$(RUN) ruff format .
	@$(RUN) ruff check --fix .

# The chart carries copies (Helm reads only files inside it); tests/unit/test_chart.py checks them.
crds: install
	@$(RUN) python -m shared.crdgen --write deploy/crds
	@cp deploy/crds/*.yaml deploy/chart/capibus/crds/

# Each service's declared Kubernetes permissions (services/<svc>/rbac.py) and NATS/Redis access
# (services/<svc>/access.py) into the chart and docs/permissions.md.
rbac: install
	@$(RUN) python -m services rbac --write deploy/chart/capibus/files/rbac --doc docs/permissions.md
	@$(RUN) python -m services access --write deploy/chart/capibus/files/access.json --doc docs/permissions.md

bench: install tools
	@$(RUN) python -m bench

# The fault soak (soak/, docs/operations.md "The fault soak"), e.g. SOAK_ARGS="--quick" or
# SOAK_ARGS="--seed 1234"; writes soak/RESULTS.md and fails when an invariant does.
soak: install tools
	@$(RUN) python -m soak $(SOAK_ARGS)

# Long outages (soak/outage.py, docs/operations.md "Long outages"): the API server down 10 min,
# the registrar and chart repository 30; OUTAGE_ARGS="--apiserver-minutes 2 ..." shortens them.
outage: install tools
	@$(RUN) python -m soak.outage $(OUTAGE_ARGS)

clean:
	rm -rf .venv .mypy_cache .ruff_cache .pytest_cache
