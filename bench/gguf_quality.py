"""Benchmark: what q8_0 and q4_0 cost a model, against its f16 GGUF file (issue #33's acceptance).

For an llmkit run and its GGUF files (`llmkit export --format gguf --quant f16|q8_0|q4_0`):
* size: each file's bytes over the run's fp32 model.safetensors;
* greedy replies: 20 prompts (recipes/smollm2/general_prompts.jsonl) through the model's chat
  template, 32 greedy tokens each; a reply equals f16's when its tokens up to the first stop token
  are the same (what `llmkit generate` returns), and `equal_32` counts the stricter all-32-tokens
  (no stop) equality;
* held-out perplexity: non-overlapping windows of the demo's English docstrings (text the model's
  import never saw; the same token ids for every file); with `--held-out FILE.jsonl` (rows `text`,
  `lang`; bench/imatrix_data.py writes the demo's held-out zh and en), per language of the file.
Each file is read by two readers: transformers (`gguf_file=`, llmkit.hf.gguf_read), which
dequantises the weights to float32 and computes in float32, so it measures the weights' rounding
alone; and llama.cpp (its Python binding, where installed), the client the files are for, whose
quantised matrix products also round the activations (to 8 bits in q8_0/q4_0 products).

    python bench/gguf_quality.py RUN F16.gguf Q8_0.gguf Q4_0.gguf [--windows 16] [--window 256]
        [--held-out held_out.jsonl] [--readers llama.cpp]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/tokenize.py shadows tokenize
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

PROMPTS = ROOT / "recipes" / "smollm2" / "general_prompts.jsonl"
HELD_OUT = ROOT / "recipes" / "demo" / "data" / "raw" / "en_docstrings.jsonl.gz"
NEW_TOKENS = 32


def held_out_windows(tokenizer, n: int, width: int, path: Path | None = None) -> dict[str, list[list[int]]]:
    """{language: up to `n` windows of `width` tokens}: the docstrings as "en", or each `lang` of `path`."""
    ids: dict[str, list[int]] = {}
    with (gzip.open(HELD_OUT, "rt", encoding="utf-8") if path is None else open(path, encoding="utf-8")) as f:
        for line in f:
            row = json.loads(line)
            ids.setdefault(row.get("lang", "en") if path else "en", []).extend(
                tokenizer.encode(row["text"]) + [tokenizer.eos_id])
            if path is None and len(ids["en"]) >= n * width:
                break
    return {lang: [t[i * width:(i + 1) * width] for i in range(min(n, len(t) // width))]
            for lang, t in sorted(ids.items())}


def nll_of(logits, window) -> float:
    import torch

    return torch.nn.functional.cross_entropy(torch.as_tensor(logits[:-1]).float(), torch.tensor(window[1:]),
                                             reduction="sum").item()


class TransformersReader:
    name = "transformers"

    def __init__(self, path: Path):
        from llmkit.hf.gguf_read import load_gguf_with_transformers

        self.model = load_gguf_with_transformers(path)[0]

    def greedy(self, prompt: list[int]) -> list[int]:
        """Argmax after argmax with the KV cache: generate()'s processors (min_new_tokens suppresses
        eos; the model's own generation config may stop early) would change the replies compared."""
        import torch

        out, ids = [], torch.tensor([prompt])
        with torch.no_grad():
            step = self.model(ids, use_cache=True)
            for _ in range(NEW_TOKENS):
                out.append(int(step.logits[0, -1].argmax()))
                step = self.model(torch.tensor([out[-1:]]), past_key_values=step.past_key_values, use_cache=True)
        return out

    def logits(self, window: list[int]):
        import torch

        with torch.no_grad():
            return self.model(torch.tensor([window])).logits[0]

    def close(self):
        del self.model


class LlamaCppReader:
    name = "llama.cpp"

    def __init__(self, path: Path):
        import llama_cpp

        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_batch=1024, n_threads=1, n_threads_batch=1,
                                   logits_all=True, verbose=False)

    def greedy(self, prompt: list[int]) -> list[int]:
        from llmkit.eval.efficiency import greedy_llama_cpp

        return greedy_llama_cpp(self.llm, prompt, NEW_TOKENS)

    def logits(self, window: list[int]):
        self.llm.reset()
        self.llm.eval(window)
        return self.llm.scores[:len(window)].copy()

    def close(self):
        self.llm.close()


class LlmkitReader:
    """The run itself, float32: the reference the f16 file rounds."""

    name = "llmkit (fp32 run)"

    def __init__(self, model):
        self.model = model

    def greedy(self, prompt):
        import torch

        from llmkit.model.decoding import generate

        with torch.no_grad():
            return generate(self.model, torch.tensor([prompt]), NEW_TOKENS, greedy=True)[0, len(prompt):].tolist()

    def logits(self, window):
        import torch

        with torch.no_grad():
            return self.model(torch.tensor([window]))[0]

    def close(self):
        pass


def measure(reader, prompts, windows: dict) -> dict:
    replies = [reader.greedy(p) for p in prompts]
    ppl, tokens = {}, {}
    for lang, group in windows.items():
        nll = sum(nll_of(reader.logits(w), w) for w in group)
        tokens[lang] = sum(len(w) - 1 for w in group)
        ppl[lang] = math.exp(nll / tokens[lang])
    reader.close()
    return {"replies": replies, "ppl": ppl, "ppl_tokens": tokens}


def until_stop(ids, stop_ids):
    end = next((i for i, t in enumerate(ids) if t in stop_ids), None)
    return ids if end is None else ids[:end + 1]


def common_prefix(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(replies, reference, stop_ids) -> dict:
    """`mean_common_prefix`: the greedy tokens a reply shares with the reference before they part (a model
    that never stops within 32 tokens parts at its first near-tie, so equality alone says little there)."""
    return {"equal": sum(until_stop(a, stop_ids) == until_stop(b, stop_ids) for a, b in zip(replies, reference)),
            "equal_32": sum(a == b for a, b in zip(replies, reference)), "prompts": len(reference),
            "mean_reply_tokens": sum(len(until_stop(a, stop_ids)) for a in replies) / len(replies),
            "mean_common_prefix": sum(common_prefix(until_stop(a, stop_ids), until_stop(b, stop_ids))
                                      for a, b in zip(replies, reference)) / len(replies)}


def main() -> None:
    import torch

    import llmkit
    from llmkit.checkpoints.step_folders import checkpoint_step_dir
    from llmkit.generation import encode_prompt

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", nargs="?")
    ap.add_argument("files", nargs="*", type=Path, help="GGUF files, the f16 one first")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--readers", default="transformers,llama.cpp")
    ap.add_argument("--prompts", type=Path, default=PROMPTS, help="JSONL of chat `prompt`s (the first 20 are used)")
    ap.add_argument("--held-out", type=Path, help="JSONL of held-out `text` (+ `lang`); default the docstrings")
    args = ap.parse_args()
    if not args.files:
        return print("skip: needs RUN and its GGUF files (llmkit export --format gguf; e.g. of make smollm2's run)")
    torch.manual_seed(0)
    model, tokenizer = llmkit.load(args.run)
    fp32_bytes = (checkpoint_step_dir(Path(args.run)) / "model.safetensors").stat().st_size
    texts = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines()[:20]]
    prompts = [encode_prompt(tokenizer, t, chat=True) for t in texts]
    windows = held_out_windows(tokenizer, args.windows, args.window, args.held_out)
    stop = set(tokenizer.stop_ids)
    readers = {"transformers": TransformersReader, "llama.cpp": LlamaCppReader}
    label = {f: f"{f.parent.name}/{f.name}" for f in args.files}  # two q4_k_m files: with and without imatrix
    out = {"fp32_bytes": fp32_bytes, "sizes": {label[f]: f.stat().st_size for f in args.files},
           "ratio_to_fp32": {label[f]: round(f.stat().st_size / fp32_bytes, 4) for f in args.files}}
    reference = measure(LlmkitReader(model.eval()), prompts, windows)
    out["fp32"] = {"ppl": reference["ppl"], "ppl_tokens": reference["ppl_tokens"]}
    del model
    for name in args.readers.split(","):
        results = {}
        for f in args.files:
            results[label[f]] = measure(readers[name](f), prompts, windows)
            shown = ", ".join(f"{lang} {v:.4f}" for lang, v in results[label[f]]["ppl"].items())
            print(f"{name} {label[f]}: ppl {shown}", file=sys.stderr, flush=True)
        f16 = results[label[args.files[0]]]
        out[name] = {f: {"ppl": r["ppl"], "ppl_vs_f16": {k: v / f16["ppl"][k] - 1 for k, v in r["ppl"].items()},
                         "vs_f16": compare(r["replies"], f16["replies"], stop),
                         "vs_fp32_run": compare(r["replies"], reference["replies"], stop)}
                     for f, r in results.items()}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
