# sft: $(WS)/$(SFT_FROM) (checkpoint run) + $(WS)/$(SFT_DATA) (`ingest --kind sft`)
#      [+ $(WS)/$(SFT_EVAL) (held-out rows, scored by exact match)] -> $(WS)/sft
# Without SFT_EVAL a stable share (eval_fraction) of SFT_DATA is held out. A killed run resumes
# on the next make. Settings: recipe section `sft`, or SFT_FLAGS, e.g. --set max_steps=300.
SFT_FROM ?= pretrain
SFT_DATA ?= sft_train
SFT_EVAL ?=
SFT_FLAGS ?=

$(WS)/sft/manifest.json: $(WS)/$(SFT_FROM)/manifest.json $(WS)/$(SFT_DATA)/manifest.json \
		$(if $(SFT_EVAL),$(WS)/$(SFT_EVAL)/manifest.json) $(RECIPE)
	$(LLMKIT) sft --from $(SFT_FROM) --in $(SFT_DATA) $(if $(SFT_EVAL),--eval $(SFT_EVAL)) \
		$(STAGE_FLAGS) $(SFT_FLAGS)
