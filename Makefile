# Developer verbs. Each creates .venv on first use and installs what it needs:
# torch first (pinned; override TORCH_SPEC for a GPU build), then llmkit with its dev extra.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# pytest-xdist workers of `make test` (one per core; 0 = one process); a test module's tests
# stay on one worker, so its module fixtures are built once
PYTEST_WORKERS ?= auto
BIN := $(abspath $(VENV))/bin
INSTALLED := $(VENV)/.installed

.PHONY: setup demo web smollm2 test bench lint clean-workspace

setup: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	# the compiled kernels (chunk-cache encoder, dedup) build once (~1 min): here, not in the
	# first stage that uses them
	$(BIN)/python -c "import llmkit.chunk_cache as c, llmkit.data.dedup.compiled as d, llmkit.data.document as r, llmkit.data.decontam_index as x; c.kernels(); d.kernels(); r.kernels(); x.kernels()"
	touch $@

demo: setup
	$(MAKE) --no-print-directory -C recipes/demo LLMKIT=$(BIN)/llmkit PYTHON=$(BIN)/python

# the web recipe: a WARC of real pages -> ingest -> clean (language, URL, line dedup, PII) -> dedup,
# and what each step removed (recipes/web; its own workspace, workspace-web)
web: setup
	$(MAKE) --no-print-directory -C recipes/web LLMKIT=$(BIN)/llmkit PYTHON=$(BIN)/python

# SmolLM2-135M-Instruct from its GGUF file: import, SFT, DPO, general ability before and after
# (recipes/smollm2; not in demo; its measured times are in the README)
smollm2: setup
	$(BIN)/pip install -q -e ".[gguf]"
	$(MAKE) --no-print-directory -C recipes/smollm2 LLMKIT=$(BIN)/llmkit PYTHON=$(BIN)/python

test: setup
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope tests

bench: setup
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

lint: setup
	$(BIN)/python -m pyflakes llmkit tests bench

clean-workspace:
	rm -rf workspace
