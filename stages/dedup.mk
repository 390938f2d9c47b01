# dedup: $(WS)/clean -> $(WS)/dedup (method, thresholds: recipe section `dedup`, or DEDUP_FLAGS,
# e.g. DEDUP_FLAGS = --method exact --workers 8). Across machines, run
# `llmkit dedup --phase P --rank R --world-size W` for P = signatures, buckets, clusters, filter
# in turn, then this target commits the artifact.
DEDUP_FLAGS ?=

$(WS)/dedup/manifest.json: $(WS)/clean/manifest.json $(RECIPE)
	$(LLMKIT) dedup $(STAGE_FLAGS) $(DEDUP_FLAGS)
