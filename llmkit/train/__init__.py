"""Training: the shared engine (`llmkit.train.engine`), checkpoint runs (`.checkpoint`), metrics
(`.metrics`), process-group setup (`.distributed`) and the trainers built on them."""
