# ppl-filter: $(WS)/$(PPL_FILTER_IN) + $(WS)/$(PPL_FILTER_MODEL) (scoring LM run) -> $(WS)/filtered
# Thresholds and buckets: recipe section `ppl-filter` or PPL_FILTER_FLAGS, e.g.
# PPL_FILTER_FLAGS = --set max_ppl=8 (threshold) or --set keep_buckets=head,middle group_by=lang.
# A KenLM model instead of a run: PPL_FILTER_MODEL = (empty) and
# PPL_FILTER_FLAGS = --set backend=kenlm kenlm_model=lm.bin.
PPL_FILTER_IN ?= dedup
PPL_FILTER_MODEL ?= pretrain
PPL_FILTER_FLAGS ?=

$(WS)/filtered/manifest.json: $(WS)/$(PPL_FILTER_IN)/manifest.json \
		$(if $(PPL_FILTER_MODEL),$(WS)/$(PPL_FILTER_MODEL)/manifest.json) $(RECIPE)
	$(LLMKIT) ppl-filter --in $(PPL_FILTER_IN) $(if $(PPL_FILTER_MODEL),--model $(PPL_FILTER_MODEL)) \
		$(STAGE_FLAGS) $(PPL_FILTER_FLAGS)
