# distill: $(WS)/$(DISTILL_TEACHER) (teacher run) + $(WS)/$(DISTILL_FROM) (student run, the
#          teacher's tokenizer) + $(WS)/$(DISTILL_DATA) (`ingest --kind sft`, or prompts with
#          --set on_policy=1) [+ $(WS)/$(DISTILL_EVAL)] -> $(WS)/$(DISTILL_OUT)
# DISTILL_FLAGS = --set loss_type=reverse_kl (or jsd with beta), --set temperature=2,
# --set teacher_top_k=64 --set precompute_teacher=true. A killed run resumes on the next make.
DISTILL_TEACHER ?= dpo
DISTILL_FROM ?= student
DISTILL_DATA ?= sft_train
DISTILL_EVAL ?=
DISTILL_OUT ?= distill
DISTILL_FLAGS ?=

$(WS)/$(DISTILL_OUT)/manifest.json: $(WS)/$(DISTILL_TEACHER)/manifest.json \
		$(WS)/$(DISTILL_FROM)/manifest.json $(WS)/$(DISTILL_DATA)/manifest.json \
		$(if $(DISTILL_EVAL),$(WS)/$(DISTILL_EVAL)/manifest.json) $(RECIPE)
	$(LLMKIT) distill --teacher $(DISTILL_TEACHER) --from $(DISTILL_FROM) --in $(DISTILL_DATA) \
		$(if $(DISTILL_EVAL),--eval $(DISTILL_EVAL)) --out $(DISTILL_OUT) $(STAGE_FLAGS) $(DISTILL_FLAGS)
