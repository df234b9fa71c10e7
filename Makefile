# Entry points; `make test` works on a fresh clone (setup installs and prepares everything it needs).
SHELL := /bin/bash
PYTHON_VENV := .venv/bin/python

.PHONY: setup serve test reference

setup:
	bash scripts/setup.sh

serve: setup
	bash scripts/serve.sh

test: setup
	$(PYTHON_VENV) -m pytest -q tests

# HF transformers (torch CPU) reference outputs, from their own venv build/ref-venv.
reference:
	bash scripts/setup.sh --reference
	build/ref-venv/bin/python tests/reference/make_hf_reference.py
	build/ref-venv/bin/python tests/reference/make_tiny_references.py
