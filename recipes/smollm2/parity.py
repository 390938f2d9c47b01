"""The imported SmolLM2 against transformers on the same GGUF file: the largest logit difference
over 128 tokens of mixed text (fp32), and the greedy chat replies of both (16 new tokens).

    python recipes/smollm2/parity.py GGUF_FILE WORKSPACE/RUN    # prints one JSON line
"""

import json
import sys
from pathlib import Path

import torch
import transformers

import llmkit

QUESTIONS = ["What is the capital of France?", "中国的首都是哪里？"]
TEXT = ("The quick brown fox jumps over the lazy dog. 大语言模型的训练需要大量的中文和英文数据。 "
        "def add(a, b):\n    return a + b  # 😀 ") * 8


def main(gguf: Path, run: Path) -> dict:
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                           dtype=torch.float32).eval()
    model, tokenizer = llmkit.load(run)
    ids = torch.tensor([(tokenizer.document_start_ids() + tokenizer.encode(TEXT))[:128]])
    with torch.no_grad():
        diff = (model(ids) - hf(ids).logits).abs().max().item()
    ours = llmkit.generate(model, tokenizer, [[{"role": "user", "content": q}] for q in QUESTIONS],
                           greedy=True, max_new_tokens=16)
    theirs = []
    for q in QUESTIONS:
        prompt = hf_tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                  return_tensors="pt")
        prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
        out = hf.generate(prompt, max_new_tokens=16, do_sample=False)[0, prompt.shape[1]:]
        theirs.append(hf_tokenizer.decode(out, skip_special_tokens=True))
    return {"tokens": ids.shape[1], "max_abs_logit_diff": diff, "replies": ours,
            # llmkit drops a character cut by the token limit; transformers decodes it as U+FFFD
            "replies_equal": [a.strip() == b.strip().rstrip("\ufffd") for a, b in zip(ours, theirs)],
            "their_replies": theirs}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2])), ensure_ascii=False))
