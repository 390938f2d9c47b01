# tokenize: $(WS)/$(TOKENIZE_INPUTS) (one or more datasets) + $(WS)/tokenizer -> $(WS)/tokens
# (train/val token shards). TOKENIZE_FLAGS, e.g. --workers 8 --set val_fraction=0.01.
# Across machines, run `llmkit tokenize --rank R --world-size W` for every R first; this target
# then assembles the artifact from their shards.
TOKENIZE_INPUTS ?= $(TOKENIZER_INPUTS)
TOKENIZE_FLAGS ?=

$(WS)/tokens/manifest.json: $(foreach d,$(TOKENIZE_INPUTS),$(WS)/$(d)/manifest.json) \
		$(WS)/tokenizer/manifest.json $(RECIPE)
	$(LLMKIT) tokenize $(foreach d,$(TOKENIZE_INPUTS),--in $(d)) --tokenizer tokenizer \
		$(STAGE_FLAGS) $(TOKENIZE_FLAGS)
