#!/bin/bash
# The data stages as a chain of Slurm jobs, each after the one before succeeded:
#   LLMKIT_WORKSPACE=/shared/ws recipes/slurm/submit.sh 'corpus/*.jsonl.zst'
# TASKS=N splits every stage into N ranks (default 16: arrays 0-15); PPL_MODEL=RUN adds
# ppl-filter (on GPUs) between dedup and tokenize; TOKENIZER names the tokenizer artifact
# (default tokenizer).
set -euo pipefail
: "${LLMKIT_WORKSPACE:?export LLMKIT_WORKSPACE=<the workspace, on storage every node mounts>}"
export LLMKIT_WORKSPACE
HERE=$(cd "$(dirname "$0")" && pwd)
export TASKS=${TASKS:-16}  # each job's --world-size, whatever its array
LAST=$((TASKS - 1))
after=()

submit() {  # submit [sbatch options] SCRIPT ARGS…: the job id; later jobs wait for it
    local id
    id=$(sbatch --parsable "${after[@]}" "$@")
    after=(--dependency=afterok:${id%%;*})
    echo "submitted $* as ${id%%;*}" >&2
}

submit --array=0-$LAST $HERE/ingest.sbatch "$@"
submit $HERE/assemble.sbatch ingest "$@"
submit --array=0-$LAST $HERE/clean.sbatch
submit $HERE/assemble.sbatch clean
for phase in signatures buckets; do submit --array=0-$LAST $HERE/dedup.sbatch $phase; done
submit --array=0-0 $HERE/dedup.sbatch clusters
submit --array=0-$LAST $HERE/dedup.sbatch filter
submit $HERE/assemble.sbatch dedup
TOKENS_IN=dedup
if [ -n "${PPL_MODEL:-}" ]; then
    submit --array=0-$LAST $HERE/ppl-filter.sbatch --model "$PPL_MODEL"
    submit $HERE/assemble.sbatch ppl-filter --model "$PPL_MODEL"
    TOKENS_IN=filtered
fi
submit --array=0-$LAST $HERE/tokenize.sbatch --in $TOKENS_IN --tokenizer "${TOKENIZER:-tokenizer}"
submit $HERE/assemble.sbatch tokenize --in $TOKENS_IN --tokenizer "${TOKENIZER:-tokenizer}"
