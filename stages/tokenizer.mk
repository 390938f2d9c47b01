# tokenizer: $(WS)/$(TOKENIZER_INPUTS) (one or more datasets) -> $(WS)/tokenizer
# Settings (vocab_size, character_coverage, jieba, ...) come from the recipe section
# `tokenizer`, or TOKENIZER_FLAGS, e.g. TOKENIZER_FLAGS = --set vocab_size=16000 --workers 8.
TOKENIZER_INPUTS ?= dedup
TOKENIZER_FLAGS ?=

$(WS)/tokenizer/manifest.json: $(foreach d,$(TOKENIZER_INPUTS),$(WS)/$(d)/manifest.json) $(RECIPE)
	$(LLMKIT) tokenizer $(foreach d,$(TOKENIZER_INPUTS),--in $(d)) $(STAGE_FLAGS) $(TOKENIZER_FLAGS)
