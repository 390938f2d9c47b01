# pretrain: $(WS)/tokens (+ the tokenizer it names) [+ $(WS)/$(PRETRAIN_FROM)] -> $(WS)/pretrain
# (checkpoint run: step-*/ folders, latest, metrics.jsonl). A killed run resumes on the next make.
# Settings come from the recipe section `pretrain`, or PRETRAIN_FLAGS, e.g.
# PRETRAIN_FLAGS = --set max_steps=2000 --set zero_stage=2 --set precision=bf16.
# On several GPUs: PRETRAIN_LAUNCHER = torchrun --nproc_per_node 8 (with LLMKIT = the path of
# the llmkit script, e.g. $(shell command -v llmkit)); the deepspeed launcher works the same way.
PRETRAIN_FROM ?=
PRETRAIN_FLAGS ?=
PRETRAIN_LAUNCHER ?=

$(WS)/pretrain/manifest.json: $(WS)/tokens/manifest.json $(WS)/tokenizer/manifest.json \
		$(if $(PRETRAIN_FROM),$(WS)/$(PRETRAIN_FROM)/manifest.json) $(RECIPE)
	$(PRETRAIN_LAUNCHER) $(LLMKIT) pretrain $(if $(PRETRAIN_FROM),--from $(PRETRAIN_FROM)) \
		$(STAGE_FLAGS) $(PRETRAIN_FLAGS)
