# clean: $(WS)/raw -> $(WS)/clean
CLEAN_FLAGS ?=

$(WS)/clean/manifest.json: $(WS)/raw/manifest.json $(RECIPE)
	$(LLMKIT) clean $(STAGE_FLAGS) $(CLEAN_FLAGS)
