# tfps: the two commands of the README.
#   make demo   a local cluster (1 ps + 2 workers) trains the demo model: checkpoint,
#               SavedModel and results in runs/demo-<time>/, installing what it needs
#   make test   the whole test suite (unit, integration, system); .ci/run calls it
#   make docs   the documentation site from docs/ into site/ (mkdocs.yml), --strict

VENV    ?= .venv
PYTHON  ?= python3
STAMP   := $(VENV)/.tfps-installed
PYTEST_ARGS ?=
TF_KERAS ?= 'tf_keras==2.21.*'
TF_CPU ?= 'tensorflow-cpu==2.21.*'

.PHONY: install demo test test-next test-chaos lint unit docs docs-outputs chromium docker image collections galaxy compose-files compose-demo bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	# tensorflow-cpu (274 MB, not the extra's 572 MB "tensorflow"), then tf_keras (Keras 2, for
	# --model pkg.module:build_model), which requires the package "tensorflow": tensorflow-cpu
	# is the same code, so tf_keras goes in without its dependencies.
	$(VENV)/bin/pip install --quiet -e '.[dev]' $(TF_CPU)
	$(VENV)/bin/pip install --quiet --no-deps $(TF_KERAS)
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/tfps local --ps 1 --workers 2 --model_dir runs/demo-$$(date +%Y%m%d-%H%M%S)

# Docker engine + Compose v2 + base images + the tfps image, each step idempotent.
docker:
	bash .ci/docker-up.sh
image: docker
	bash .ci/build-image.sh

# The committed compose files are generated from the cluster plan (a unit test checks).
compose-files: install
	$(VENV)/bin/tfps compose --ps 1 --workers 2 -o compose/docker-compose.yml
	$(VENV)/bin/tfps compose --gpus 0,1 -o compose/docker-compose.gpu.yml
compose-demo: image
	cd compose && docker compose up --exit-code-from worker0 --attach worker0

# Ansible collections pinned in ansible/requirements.yml, unpacked into ansible/collections.
collections: install
	bash .ci/ansible-collections.sh

# The role and playbooks as the Ansible collection tfps.tfps (dist/tfps-tfps-<version>.tar.gz),
# assembled from tfps/ansible: galaxy/galaxy.yml, galaxy/build.py.
galaxy: install
	$(VENV)/bin/python galaxy/build.py dist

# Lint first: the configuration is [tool.ruff] in pyproject.toml.
lint: install
	$(VENV)/bin/ruff check .

unit: install collections
	$(VENV)/bin/pytest -q tests/unit $(PYTEST_ARGS)

# Exit status 5 (no test collected) is a failure here, never a silent pass; so is a test
# that skips for any reason but a missing GPU (--fail-on-skip, tests/conftest.py), and the
# end of the output counts the passed and skipped tests.
# The system tests (Docker engines, sshd hosts, Ansible plays: mostly waiting on them) run
# in a pytest of their own alongside the unit and integration tests (TensorFlow clusters on
# this machine), whose output comes as it goes; theirs is in $(SYSTEM_LOG), printed whole
# at the end. Both must pass.
SYSTEM_LOG ?= .test-system.log
test: install image collections chromium lint
	@$(VENV)/bin/pytest -q -rs --durations=25 --fail-on-skip -p no:cacheprovider tests/system $(PYTEST_ARGS) \
	  > $(SYSTEM_LOG) 2>&1 & system=$$!; \
	echo "tests/system run alongside, in $(SYSTEM_LOG)"; \
	$(VENV)/bin/pytest -q -rs --durations=40 --fail-on-skip tests/integration tests/unit $(PYTEST_ARGS); here=$$?; \
	wait $$system; there=$$?; \
	echo "================ tests/system ($(SYSTEM_LOG)) ================"; cat $(SYSTEM_LOG); \
	echo "tests/unit and tests/integration: exit $$here; tests/system: exit $$there"; \
	if [ $$here -eq 5 ] && [ $$there -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi; \
	for rc in $$here $$there; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done

# Debian's chromium for the docs site's browser test (tests/integration/test_docs_browser.py);
# nothing to do where /usr/bin/chromium exists (about 75 s of apt where it does not).
chromium:
	bash .ci/chromium.sh

# The documentation site (MkDocs + Material, mkdocs.yml): --strict fails on a broken link or
# anchor and on a page left out of the nav; the generated reference pages are written first.
# Preview: $(VENV)/bin/mkdocs serve (http://127.0.0.1:8000).
docs: install
	$(VENV)/bin/python docs/gen_reference.py
	$(VENV)/bin/python docs/gen_errors.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The output the tutorials show, from real runs of their commands (docs/gen_outputs.py).
docs-outputs: install
	$(VENV)/bin/python docs/gen_outputs.py

# The 20-fault chaos job (tests/integration/test_chaos.py, part of `make test`) on its own.
CHAOS_TEST := tests/integration/test_chaos.py
test-chaos: install
	$(VENV)/bin/pytest -q -rs --fail-on-skip $(CHAOS_TEST) $(PYTEST_ARGS)

# The next TensorFlow before its users: the compat self-check, then the unit and integration suites
# against the newest pre-release in .venv-next (Keras tests deselected while no tf_keras matches it).
# Not part of `make test`; docs/design/next-tensorflow.md keeps what the last run found.
test-next:
	bash .ci/test-next.sh $(PYTEST_ARGS)

# Benchmarks print ratios measured side by side; they are not tests (docs/benchmarks.md).
bench: install
	$(VENV)/bin/python bench/run.py $(BENCH_ARGS)

clean:
	rm -rf runs .pytest_cache
