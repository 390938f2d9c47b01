# export: $(WS)/$(EXPORT_FROM) (a checkpoint run) -> $(WS)/export/hf, a Hugging Face transformers folder
# (config.json, model.safetensors, tokenizer.json, ...) that AutoModelForCausalLM / AutoTokenizer load;
# its llmkit_export.json (and manifest stats) record the logit difference measured against transformers.
# EXPORT_FLAGS = --set dtype=bfloat16 writes bf16 weights; --set probe=false skips the parity check.
EXPORT_FROM ?= sft
EXPORT_FLAGS ?=

$(WS)/export/hf/manifest.json: $(WS)/$(EXPORT_FROM)/manifest.json $(RECIPE)
	$(LLMKIT) export --from $(EXPORT_FROM) --out export/hf $(STAGE_FLAGS) $(EXPORT_FLAGS)
