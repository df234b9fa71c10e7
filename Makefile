# Entry points; `make test` works on a fresh clone (setup installs and prepares everything it needs).
SHELL := /bin/bash
PYTHON_VENV := .venv/bin/python

.PHONY: setup serve test test-fast soak reference docs

setup:
	bash scripts/setup.sh

serve: setup
	bash scripts/serve.sh

test: setup
	$(PYTHON_VENV) -m pytest -q --durations=20 tests

# The fast tier for a developer's edit-test loop: everything but the tests marked slow (a real server,
# the soak, model runs of seconds; tests/conftest.py). `make test` (CI) runs both tiers.
test-fast: setup
	$(PYTHON_VENV) -m pytest -q --durations=10 -m "not slow" tests

# The documentation site (mkdocs.yml, docs/) into build/site; --strict: a broken link or anchor fails.
# docs/reference/configuration.md is generated from the code first (docs/gen_config_reference.py).
docs: setup
	@$(PYTHON_VENV) -c 'import material' 2>/dev/null || { echo "docs: MkDocs Material needs Python >= 3.11.5 in .venv (pyproject markers)"; exit 1; }
	$(PYTHON_VENV) docs/gen_config_reference.py
	NO_MKDOCS_2_WARNING=1 $(PYTHON_VENV) -m mkdocs build --strict --site-dir build/site

# Soak and fault suite (tests/soak/run_soak.py): the server of `make serve` under mixed traffic with faults on a
# schedule, for SOAK_MINUTES minutes of traffic; report in build/soak/ (report.json, soak.png).
SOAK_MINUTES ?= 30
soak: setup
	$(PYTHON_VENV) tests/soak/run_soak.py --minutes $(SOAK_MINUTES) $(SOAK_ARGS)

# HF transformers and PEFT (torch CPU) reference outputs, from their own venv build/ref-venv.
reference:
	bash scripts/setup.sh --reference
	build/ref-venv/bin/python tests/reference/make_hf_reference.py
	build/ref-venv/bin/python tests/reference/make_tiny_references.py
	build/ref-venv/bin/python tests/reference/make_lora_references.py
