# dpo: $(WS)/$(DPO_FROM) (policy) [+ $(WS)/$(DPO_REF) (reference; default: the policy)]
#      + $(WS)/$(DPO_DATA) (`ingest --kind preference`) [+ $(WS)/$(DPO_EVAL)] -> $(WS)/dpo
# DPO_FLAGS = --set loss_type=ipo (or cdpo / robust with label_smoothing, reference_free; orpo /
# simpo hold no reference model: leave DPO_REF empty),
# --set beta=0.1. Held-out rows are scored by exact match before and after.
DPO_FROM ?= sft
DPO_REF ?=
DPO_DATA ?= pref_train
DPO_EVAL ?=
DPO_FLAGS ?=

$(WS)/dpo/manifest.json: $(WS)/$(DPO_FROM)/manifest.json $(WS)/$(DPO_DATA)/manifest.json \
		$(if $(DPO_REF),$(WS)/$(DPO_REF)/manifest.json) \
		$(if $(DPO_EVAL),$(WS)/$(DPO_EVAL)/manifest.json) $(RECIPE)
	$(LLMKIT) dpo --from $(DPO_FROM) --in $(DPO_DATA) $(if $(DPO_REF),--ref $(DPO_REF)) \
		$(if $(DPO_EVAL),--eval $(DPO_EVAL)) $(STAGE_FLAGS) $(DPO_FLAGS)
