# ppo: $(WS)/$(PPO_FROM) (policy) + $(WS)/$(PPO_PROMPTS) (prompt dataset, `ingest --kind prompt`)
#      [+ $(WS)/$(PPO_REWARD) (reward model)] [+ $(WS)/$(PPO_EVAL) (held-out prompts)] -> $(WS)/ppo
# Without PPO_REWARD the reward is the verifiable exact match against each prompt's `answer`;
# PPO_FLAGS = --set algo=grpo switches to GRPO, --set algo=rloo to RLOO (both sample group_size
# responses per prompt, no value model); --set reward=mix adds exact match to the RM score.
PPO_FROM ?= sft
PPO_PROMPTS ?= prompts_train
PPO_REWARD ?=
PPO_EVAL ?=
PPO_FLAGS ?=

$(WS)/ppo/manifest.json: $(WS)/$(PPO_FROM)/manifest.json $(WS)/$(PPO_PROMPTS)/manifest.json \
		$(if $(PPO_REWARD),$(WS)/$(PPO_REWARD)/manifest.json) \
		$(if $(PPO_EVAL),$(WS)/$(PPO_EVAL)/manifest.json) $(RECIPE)
	$(LLMKIT) ppo --from $(PPO_FROM) --in $(PPO_PROMPTS) $(if $(PPO_REWARD),--reward $(PPO_REWARD)) \
		$(if $(PPO_EVAL),--eval $(PPO_EVAL)) $(STAGE_FLAGS) $(PPO_FLAGS)
