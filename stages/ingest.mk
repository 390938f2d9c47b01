# ingest: RAW_INPUTS (files) -> $(WS)/raw
RAW_INPUTS ?=
INGEST_FLAGS ?=

$(WS)/raw/manifest.json: $(RAW_INPUTS) $(RECIPE)
	$(LLMKIT) ingest $(RAW_INPUTS) $(STAGE_FLAGS) $(INGEST_FLAGS)

# one task file of a kind (sft | preference | prompt | feedback) -> $(WS)/NAME:
#   $(eval $(call ingest_task,NAME,KIND,FILE))
define ingest_task
$(WS)/$(1)/manifest.json: $(3)
	$(LLMKIT) ingest $$< --kind $(2) --out $(1) $(STAGE_FLAGS)
endef
