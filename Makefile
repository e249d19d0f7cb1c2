# The two commands a newcomer needs:
#   make demo   run a real kill-one-rank drill on the built-in lab (creates .venv, installs torch 2.13.0 CPU)
#   make test   install the dev dependencies and run the test suite
# The venv's interpreter is one every account can run: as root, a lab's job runs as the unprivileged account
# chaoskit-lab, which cannot run a Python under a closed folder (a pyenv in /root, mode 0700), so the job would
# keep root (docs/safety.md). The system's /usr/bin/python3 when it is 3.10+ with venv (Debian: python3-venv),
# else python3 from PATH; `make PYTHON=...` picks another.
PYTHON ?= $(shell /usr/bin/python3 -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 10))' \
                  2>/dev/null && echo /usr/bin/python3 || echo python3)
VENV   ?= .venv
BIN     = $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo test fuzz bench campaign soak schema readme docker-image clean lint-imports

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Editable installs as a plain path entry: setuptools' default puts an import hook in every
# Python start-up of the venv, which costs each chaoskit command tens of ms (bench/bench_cli.py).
EDITABLE = --config-settings editable_mode=compat -e

# Stamps re-run the install whenever pyproject.toml changes.
$(VENV)/.workload: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(EDITABLE) '.[workload]'
	touch $@

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(EDITABLE) '.[workload,ssh,dev]'
	touch $@ $(VENV)/.workload

# lm-resiliency for its drill (tests/test_lm_resiliency.py puts it on the job's PYTHONPATH), in a folder of its
# own and not in the venv: installed, its torchrun.handlers entry point fails to load in every torchrun of the venv
# and logs a traceback into every job's log (0.2.0's create_rendezvous_handler takes an argument torchrun does not give).
$(VENV)/lmr/.stamp: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --no-deps --upgrade --target $(VENV)/lmr 'lm-resiliency==0.2.0'
	touch $@

# One drill with its phase table, then a short game day (coverage, JUnit, HTML report).
demo: $(VENV)/.workload
	$(BIN)/chaoskit run scenarios/kill-rank.yaml
	$(BIN)/chaoskit gameday scenarios/kill-uninstrumented.yaml scenarios/hang-rank.yaml

test: $(VENV)/.dev $(VENV)/lmr/.stamp
	$(BIN)/python -m pytest -n 2 --lanes $(PYTEST_ARGS)

# The loaders' property tests at full size: over 10,000 generated inputs (scenario, inventory
# and compose files), each checked by `chaoskit validate`; prints the figures.
fuzz: $(VENV)/.dev
	CHAOSKIT_FUZZ=1 $(BIN)/python -m pytest -p no:cacheprovider -s -q tests/test_fuzz_inputs.py $(PYTEST_ARGS)

bench: $(VENV)/.dev
	for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# A 20-minute fault campaign on the process lab: ETTR measured against the simulator's prediction
# (seed 14 draws 12 faults of three kinds: failed GPUs, crashed and hung ranks).
campaign: $(VENV)/.workload
	$(BIN)/chaoskit campaign examples/campaign.yaml --duration 20m --mtbf 2m --seed 14 --out reports/campaign-20m

# The long forms of tests/test_soak.py (root; bench/README.md has their figures): 1,000 controller deaths over
# every lasting case, then 50 drills of the shipped scenarios as game days, 10% of their controllers SIGKILLed.
soak: $(VENV)/.dev
	$(BIN)/python bench/soak.py --deaths 1000 --lanes --seed 32
	$(BIN)/python bench/soak.py --soak 50 --seed 32

# The Docker lab's node image, built without any registry (docker/build-offline.sh says how);
# with Docker Hub and PyPI, `docker compose build` builds the same docker/Dockerfile.
docker-image: $(VENV)/.dev
	PYTHON=$(BIN)/python docker/build-offline.sh

schema: $(VENV)/.workload
	$(BIN)/chaoskit schema -o chaoskit.schema.json
	$(BIN)/chaoskit schema --result -o chaoskit.result.schema.json

# The README's table of fault kinds, from each kind's spec (tests/test_docs.py keeps it current).
readme: $(VENV)/.workload
	$(BIN)/python -c 'import pathlib, chaoskit.faults.registry as r; p = pathlib.Path("README.md"); p.write_text(r.readme_with_fault_kinds(p.read_text()))'

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

# The layering contract of docs/architecture.md (the test suite runs it too).
lint-imports: $(VENV)/.dev
	$(BIN)/lint-imports
