# Shared variables of the stage fragments. Include this first, then stages/<stage>.mk.
# Targets are artifacts' manifest.json files; llmkit itself decides whether a stage is up to date
# (fingerprints of inputs and config), so a target that make re-runs may print "up to date".
LLMKIT ?= llmkit
WS ?= workspace
RECIPE ?=
LLMKIT_FLAGS ?=
STAGE_FLAGS = -w $(WS) $(if $(RECIPE),--recipe $(RECIPE)) $(LLMKIT_FLAGS)
