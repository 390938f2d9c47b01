# eval: $(WS)/RUN (checkpoint run) [+ token shards, eval files, reward model…] -> $(WS)/eval/RUN
# One pattern target per run: `make $(WS)/eval/sft/manifest.json` runs `llmkit eval --from sft`.
# What runs is the recipe section `eval`, EVAL_FLAGS (every run) and EVAL_FLAGS_<RUN> (that run), e.g.
# EVAL_FLAGS = --set tasks=ppl,choice --set choice.files=data/eval/mmlu_en_test.jsonl,data/eval/ceval_zh_test.jsonl
# EVAL_DEPS lists further artifacts the tasks read (e.g. $(WS)/tokens/manifest.json $(WS)/rm/manifest.json).
EVAL_DEPS ?=
EVAL_FLAGS ?=

$(WS)/eval/%/manifest.json: $(WS)/%/manifest.json $(EVAL_DEPS) $(RECIPE)
	$(LLMKIT) eval --from $* $(STAGE_FLAGS) $(EVAL_FLAGS) $(EVAL_FLAGS_$*)
