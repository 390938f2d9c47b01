"""The SFT rows of the recipe: the task's rows, and the base model's own greedy replies to general
prompts (`general_prompts.jsonl`, answered by `llmkit generate --from smollm2`), each repeated
`copies` times. Training on the base's own replies (self-distillation) anchors what the model
already did on everything but the task, so no outside data is needed; the prompts share no
question with `general_eval.jsonl`, which measures what is kept.

    python recipes/smollm2/mix_general.py TASK_ROWS BASE_REPLIES COPIES OUT   # writes OUT (jsonl)
"""

import json
import sys
from pathlib import Path


def general_rows(replies: Path, copies: int) -> list[dict]:
    rows = [json.loads(line) for line in replies.read_text(encoding="utf-8").splitlines() if line.strip()]
    # a reply cut at the token limit is kept: SFT truncates rows to seq_len anyway, and a cut reply
    # carries no end of turn, so it teaches no early stop
    return [{"prompt": r["prompt"], "response": r["completion"].strip(), "task": "general"}
            for r in rows if r["completion"].strip()] * copies


def main(task_rows: Path, replies: Path, copies: int, out: Path) -> int:
    lines = [line for line in task_rows.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines += [json.dumps(r, ensure_ascii=False) for r in general_rows(replies, copies)]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


if __name__ == "__main__":
    n = main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
    print(f"{sys.argv[4]}: {n} rows")
