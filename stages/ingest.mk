# ingest: RAW_INPUTS (files) -> $(WS)/raw
RAW_INPUTS ?=
INGEST_FLAGS ?=

$(WS)/raw/manifest.json: $(RAW_INPUTS) $(RECIPE)
	$(LLMKIT) ingest $(RAW_INPUTS) $(STAGE_FLAGS) $(INGEST_FLAGS)
