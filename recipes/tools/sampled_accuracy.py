"""Held-out accuracy of sampled replies, with the calculator run, of a calculator-demo run:
`python recipes/tools/sampled_accuracy.py WS RUN [--samples 8] [--temperature 1.0] [--prompts 100]`.

The runs' manifests give greedy accuracy, which moves by whole prompts; GRPO trains the policy it
samples from. This scores `--samples` replies per held-out prompt (`WS/data/prompts_eval.jsonl`)
at `--temperature`, each rollout running the calculator as the GRPO rollouts do, and the answer
compared by the math verifier: the mean share right, pass@k (a prompt with a right sample), the
calculator calls per sample, and the prompts whose samples are mixed (what GRPO learns from).
The same seed gives the same samples; the line is also written to `WS/sampled_<RUN>.json`."""

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ws", type=Path)
    parser.add_argument("run")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()

    import torch

    from llmkit.checkpoints.loading import load_model, load_tokenizer
    from llmkit.rewards.math import answers_equal
    from llmkit.rewards.tools import load_tools
    from llmkit.train.rollouts import rollout_prompts
    from llmkit.train.tool_rollouts import ToolSetup, sample_tool_responses

    torch.manual_seed(a.seed)
    model, step = load_model(a.ws / a.run)
    tokenizer = load_tokenizer(step)
    rows = [json.loads(line) for line in (a.ws / "data" / "prompts_eval.jsonl").read_text().splitlines()][:a.prompts]
    prompts, _ = rollout_prompts(tokenizer, rows, model.config.max_seq_len - 64, "prompts_eval", True)
    setup = ToolSetup(load_tools("calculator"), tokenizer, 1, 5.0)  # one call, as the recipe's max_tool_turns
    right, calls = [], 0.0
    with torch.no_grad():
        for prompt in prompts:
            sampled = sample_tool_responses(model, [prompt] * a.samples, setup, max_new_tokens=64,
                                            temperature=a.temperature, stop_ids=tokenizer.stop_ids,
                                            pad_id=tokenizer.pad_id, decode=tokenizer.decode, device="cpu")
            calls += sampled.metrics["tool_calls"] * a.samples
            right.append(sum(answers_equal(answer, text) for answer, text in zip(sampled.answers, sampled.texts)))
    n, k = len(right), a.samples
    result = {"run": a.run, "prompts": n, "samples": k, "temperature": a.temperature,
              "sample_accuracy": sum(right) / (n * k), f"pass@{k}": sum(c > 0 for c in right) / n,
              "calls_per_sample": calls / (n * k), "mixed_prompts": sum(0 < c < k for c in right) / n}
    print(json.dumps(result))
    (a.ws / f"sampled_{a.run}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
