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

.PHONY: setup demo web smollm2 llama-cpp test bench lint clean-workspace

setup: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	# the compiled kernels (chunk-cache encoder, dedup, decoding) build once (~1 min): here, not in the
	# first stage that uses them
	$(BIN)/python -c "import llmkit.tokenizers.chunk_cache as c, llmkit.data.dedup.compiled as d, llmkit.data.document as r, llmkit.data.decontam_index as x; c.kernels(); d.kernels(); d.cluster_kernels(); r.kernels(); x.kernels()"
	$(BIN)/python -c "import llmkit.model.cpu_kernels as k; k.library()"  # decoding's kernels (~3 s; none without AVX-512)
	touch $@

demo: setup
	$(MAKE) --no-print-directory -C recipes/demo LLMKIT=$(BIN)/llmkit PYTHON=$(BIN)/python

# the web recipe: a WARC of real pages -> ingest -> clean (language, URL, line dedup, PII) -> dedup,
# and what each step removed (recipes/web; its own workspace, workspace-web)
web: setup
	$(MAKE) --no-print-directory -C recipes/web LLMKIT=$(BIN)/llmkit PYTHON=$(BIN)/python

# SmolLM2-135M-Instruct from its GGUF file: import, SFT, DPO, general ability before and after
# (recipes/smollm2; not in demo; its measured times are in bench/results/)
smollm2: setup
	$(BIN)/pip install -q -e ".[gguf]"
	$(MAKE) --no-print-directory -C recipes/smollm2 LLMKIT=$(BIN)/llmkit PYTHON=$(BIN)/python

# llama.cpp's Python binding built from PyPI's source package (needs cmake and a C++ compiler;
# 10-30 min on 2 cores, so once: the wheel is cached under .cache/), the real client that
# tests/hf/test_gguf_export_llama_cpp.py checks `llmkit export --format gguf` against; not in `test`
LLAMA_CPP_SPEC ?= llama-cpp-python
LLAMA_CPP_WHEELS := .cache/llama-cpp
# the binding's multimodal (llava/mtmd) library is a third of the build and loaded only for images
LLAMA_CPP_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
llama-cpp: setup
	mkdir -p $(LLAMA_CPP_WHEELS)
	ls $(LLAMA_CPP_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || \
	  CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-1} nice -n 10 \
	  $(BIN)/pip wheel --no-deps --no-binary llama-cpp-python -w $(LLAMA_CPP_WHEELS) "$(LLAMA_CPP_SPEC)"
	$(BIN)/pip install -q $(LLAMA_CPP_WHEELS)/llama_cpp_python-*.whl

test: setup
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope tests

# every bench at its --quick sizes (BENCH_QUICK=1): each runs end to end in seconds to a minute, or
# skips with the reason where it needs what a fresh clone lacks (an export: make smollm2; a demo
# workspace: make demo); full runs take their defaults, their figures are in bench/results/
bench: setup
	for b in bench/*.py; do echo "== $$b"; BENCH_QUICK=1 $(BIN)/python $$b || exit 1; done

lint: setup
	$(BIN)/python -m pyflakes llmkit tests bench

clean-workspace:
	rm -rf workspace
