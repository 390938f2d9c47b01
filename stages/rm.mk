# rm: $(WS)/$(RM_FROM) (checkpoint run) + $(WS)/$(RM_DATA) (`ingest --kind preference`)
#     [+ $(WS)/$(RM_EVAL) (held-out pairs, for pairwise accuracy)] -> $(WS)/rm (reward model,
# usable as `ppo --reward rm`). Settings: recipe section `rm`, or RM_FLAGS, e.g.
# RM_FLAGS = --set center_coef=0.01.
RM_FROM ?= sft
RM_DATA ?= pref_train
RM_EVAL ?=
RM_FLAGS ?=

$(WS)/rm/manifest.json: $(WS)/$(RM_FROM)/manifest.json $(WS)/$(RM_DATA)/manifest.json \
		$(if $(RM_EVAL),$(WS)/$(RM_EVAL)/manifest.json) $(RECIPE)
	$(LLMKIT) rm --from $(RM_FROM) --in $(RM_DATA) $(if $(RM_EVAL),--eval $(RM_EVAL)) \
		$(STAGE_FLAGS) $(RM_FLAGS)
