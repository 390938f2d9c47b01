# decontaminate: $(WS)/$(DECONTAMINATE_IN) + DECONTAMINATE_AGAINST (evaluation files) -> $(WS)/decontaminated
# Documents holding n-grams of the evaluation items are removed (removed/ keeps them, each with
# `contaminated_by` file:row); DECONTAMINATE_FLAGS = --set mode=excise cuts the passages out instead.
DECONTAMINATE_IN ?= filtered
DECONTAMINATE_AGAINST ?=
DECONTAMINATE_FLAGS ?=
decontaminate_comma := ,
decontaminate_space := $(subst ,, )

$(WS)/decontaminated/manifest.json: $(WS)/$(DECONTAMINATE_IN)/manifest.json $(DECONTAMINATE_AGAINST) \
		$(RECIPE)
	$(LLMKIT) decontaminate --in $(DECONTAMINATE_IN) \
		--against $(subst $(decontaminate_space),$(decontaminate_comma),$(strip $(DECONTAMINATE_AGAINST))) \
		$(STAGE_FLAGS) $(DECONTAMINATE_FLAGS)
