"""Evaluation of checkpoints (`llmkit eval`) and the scoring they share with `llmkit ppl-filter`.

- `scoring`: log-likelihood of token sequences with a causal LM, batched by length;
- `perplexity`: per-document perplexity with a sliding window (token val split, datasets);
- `choice`: multiple-choice accuracy (MMLU / C-Eval files), zero- and few-shot;
- `generation`: greedy generation scored with BLEU (sacrebleu) and ROUGE (rouge-score);
- `preference`: reward-model pairwise accuracy, policy-vs-reference win rate;
- `efficiency`: generation latency, tokens/s, peak memory;
- `stage`: `EvalConfig` and `run_eval`, which writes `eval/<name>/results.json`.
"""
