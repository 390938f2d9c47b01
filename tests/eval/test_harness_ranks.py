"""llmkit's lm-eval LM under two ranks (torchrun, gloo on CPU): lm-eval gives each rank its share
of the documents, each scores only its share, and rank 0's gathered results equal one process's.

Run by torchrun, this file is also the worker (`python -m torch.distributed.run … this-file RUN
TASKS OUT`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import llmkit
from llmkit.eval.harness import HarnessConfig, run_harness
from llmkit.eval.harness_lm import LlmkitLM
from tests.eval.test_harness_parity import ROLLING

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # slow: three processes
REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes/demo/data/eval"
LIMIT = 7  # odd: the ranks get 4 and 3 documents, and lm-eval pads the second with a repeat


class CountingLM(LlmkitLM):
    """LlmkitLM that remembers how many log-likelihood requests it was given."""

    requests = 0

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        self.requests += len(requests)
        return super().loglikelihood(requests, disable_tqdm)


def harness_config(tasks: Path) -> HarnessConfig:
    return HarnessConfig(tasks=["mmlu_reversal", "cmmlu_reversal", "text_ppl"], include_path=str(tasks),
                         limit=LIMIT)


def evaluate(run: Path, tasks: Path) -> tuple[dict | None, int]:
    import torch

    model, tokenizer = llmkit.load(run)
    lm = CountingLM(model, tokenizer, device=torch.device("cpu"), batch_tokens=1024)
    return run_harness(lm, harness_config(tasks)), lm


def worker(run: str, tasks: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    harness, lm = evaluate(Path(run), Path(tasks))
    counts = lm.gather_object(lm.requests)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"harness": harness, "requests": counts, "world_size": lm.world_size}))
    else:
        assert harness is None
    dist.destroy_process_group()


def test_two_ranks_split_the_requests_and_gather_one_process_results(tok, tmp_path):
    from llmkit.train.distributed import free_port
    from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run

    write_checkpoint_run(tmp_path / "ws", "run", tiny_model(tok.vocab_size, seed=1, init_std=0.3, max_seq_len=128), tok)
    run, tasks, out = tmp_path / "ws" / "run", tmp_path / "tasks", tmp_path / "ranks.json"
    tasks.mkdir()
    texts = [json.loads(line)["prompt"] for line in (DEMO / "generation_en.jsonl").read_text().splitlines()]
    docs = tmp_path / "docs.jsonl"  # some longer than a 128-token window: several rolling windows
    docs.write_text("".join(json.dumps({"text": " ".join(texts[i:] + texts[:i])[:80 + 300 * (i % 3)]}) + "\n"
                            for i in range(LIMIT)))
    (tasks / "ppl.yaml").write_text(ROLLING.format(data=docs))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), __file__, str(run), str(tasks), str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    ranks = json.loads(out.read_text())
    one, lm = evaluate(run, tasks)
    assert ranks["world_size"] == 2 and lm.world_size == 1
    # two tasks of 7 questions x 4 choices: one process scores 56 requests; each rank 4 questions
    # a task (the second pads its 3 with a repeat of one), 32 requests
    assert lm.requests == 2 * 4 * LIMIT and ranks["requests"] == [2 * 4 * 4, 2 * 4 * 4]
    for task in ("mmlu_reversal", "cmmlu_reversal"):
        mine, alone = ranks["harness"]["results"][task], one["results"][task]
        assert {k: v for k, v in mine.items() if "stderr" not in k} == {k: v for k, v in alone.items() if "stderr" not in k}
        # the gathered per-question scores come rank by rank: the stderr sums them in another order
        assert mine["acc_stderr,none"] == pytest.approx(alone["acc_stderr,none"], rel=1e-12)
        assert ranks["harness"]["n-samples"][task] == one["n-samples"][task] == {"original": 200, "effective": LIMIT}
    for metric in ("word_perplexity,none", "bits_per_byte,none"):
        assert ranks["harness"]["results"]["text_ppl"][metric] == \
            pytest.approx(one["results"]["text_ppl"][metric], rel=1e-6)


if __name__ == "__main__":
    worker(*sys.argv[1:4])
