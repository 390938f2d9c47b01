# kto: $(WS)/$(KTO_FROM) (policy) [+ $(WS)/$(KTO_REF) (reference; default: the policy)]
#      + $(WS)/$(KTO_DATA) (`ingest --kind feedback`) [+ $(WS)/$(KTO_EVAL)] -> $(WS)/kto
# KTO_FLAGS = --set beta=0.1 --set desirable_weight=1.0 --set undesirable_weight=1.0.
# Held-out desirable completions are scored by exact match before and after.
KTO_FROM ?= sft
KTO_REF ?=
KTO_DATA ?= feedback_train
KTO_EVAL ?=
KTO_FLAGS ?=

$(WS)/kto/manifest.json: $(WS)/$(KTO_FROM)/manifest.json $(WS)/$(KTO_DATA)/manifest.json \
		$(if $(KTO_REF),$(WS)/$(KTO_REF)/manifest.json) \
		$(if $(KTO_EVAL),$(WS)/$(KTO_EVAL)/manifest.json) $(RECIPE)
	$(LLMKIT) kto --from $(KTO_FROM) --in $(KTO_DATA) $(if $(KTO_REF),--ref $(KTO_REF)) \
		$(if $(KTO_EVAL),--eval $(KTO_EVAL)) $(STAGE_FLAGS) $(KTO_FLAGS)
