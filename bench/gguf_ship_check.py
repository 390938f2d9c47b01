"""The ship check on a real model (issue 52): `llmkit export --format gguf --check` of an imported
SmolLM2-135M-Instruct run in f16, q8_0 and q4_k_m (20 of the smollm2 recipe's general prompts),
each file's perplexity on held-out English and Chinese text through llama.cpp (llama-cpp-python)
against the f16 file's and llmkit's fp32 model's, and a LoRA run of a few SFT steps exported as
a llama.cpp adapter file, decoded over the base's f16 file against llmkit's merged model.

    python bench/gguf_ship_check.py WORKSPACE RUN OUT.json   (WORKSPACE is written: a copy)
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLMKIT = [str(Path(sys.executable).parent / "llmkit")]
PROMPTS = [json.loads(line) for line in (ROOT / "recipes/smollm2/general_prompts.jsonl").read_text().splitlines()][::6][:20]
QUANTS = ("f16", "q8_0", "q4_k_m")
DOCS, CHARS = 16, 600


def heldout() -> dict[str, list[str]]:
    """The last 16 documents of the demo's Chinese prose and English docstrings, 600 characters each."""
    zh = [json.loads(line)["text"] for line in (ROOT / "recipes/demo/data/raw/zh_prose.jsonl").read_text().splitlines()]
    with gzip.open(ROOT / "recipes/demo/data/raw/en_docstrings.jsonl.gz", "rt") as f:
        en = [json.loads(line)["text"] for line in f]
    return {"en": [t[:CHARS] for t in en[-DOCS:]], "zh": [t[:CHARS] for t in zh[-DOCS:]]}


def run(*args) -> tuple[int, str, float]:
    start = time.perf_counter()
    r = subprocess.run([*LLMKIT, *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    return r.returncode, r.stdout + r.stderr, time.perf_counter() - start


def nll_llama_cpp(path: Path, docs: list[list[int]]) -> float:
    """Mean next-token negative log-likelihood (nats) of the token lists under llama.cpp."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=1024, logits_all=True, n_threads=1, verbose=False)
    total, count = 0.0, 0
    try:
        for ids in docs:
            llm.reset()
            llm.eval(ids)
            logits = np.asarray(llm.scores[:len(ids) - 1], dtype=np.float64)
            logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
            total += float((logz - logits[np.arange(len(ids) - 1), ids[1:]]).sum())
            count += len(ids) - 1
    finally:
        llm.close()
    return total / count


def nll_llmkit(model, docs: list[list[int]]) -> float:
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for ids in docs:
            logits = model(torch.tensor([ids]))[0, :-1].double()
            total += float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum"))
            count += len(ids) - 1
    return total / count


def lora(ws: Path, run_name: str, base_file: Path, out: dict) -> None:
    """A few SFT steps of rank-8 LoRA on the recipe's general questions, its adapter file, and
    llama.cpp (base f16 + adapter) against llmkit's merged model on the 20 prompts."""
    rows = [json.loads(line) for line in (ROOT / "recipes/smollm2/general_eval.jsonl").read_text().splitlines()]
    data = ws.parent / "sft_rows.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": r["prompt"]},
                                                      {"role": "assistant", "content": r["references"][0]}]}) + "\n"
                            for r in rows))
    steps = []
    for args in (("ingest", data, "--kind", "sft", "--out", "sft_train"),
                 ("sft", "--from", run_name, "--in", "sft_train", "--set", "lora.r=8", "--set", "lora.alpha=16",
                  "--set", "max_steps=6", "--set", "warmup_steps=0", "--set", "micro_batch_size=4",
                  "--set", "eval_every=0", "--set", "seq_len=128", "--set", "lr=1e-3", "--set", "threads=1"),
                 ("export", "--from", "sft", "--format", "gguf", "--set", "adapter_only=true")):
        code, text, seconds = run(*args, "-w", ws)
        steps.append({"command": " ".join(map(str, args[:3])), "exit": code, "seconds": round(seconds, 1)})
        if code:
            out["lora"] = {"steps": steps, "error": text[-2000:]}
            return
    compare_adapter(ws, base_file, out, steps)


def compare_adapter(ws: Path, base_file: Path, out: dict, steps=()) -> None:
    import llama_cpp
    import torch

    import llmkit
    from llmkit.eval.efficiency import greedy_llama_cpp
    from llmkit.generation import encode_prompt
    from llmkit.hf.ship_check import first_difference, llmkit_reply, top_two_gap

    adapter = ws / "export" / "gguf-adapter-f16" / "adapter-f16.gguf"
    merged, tokenizer = llmkit.load(ws / "sft")
    prompts = [encode_prompt(tokenizer, p["prompt"], True) for p in PROMPTS]
    llm = llama_cpp.Llama(model_path=str(base_file), lora_path=str(adapter), n_ctx=512, n_threads=1, verbose=False)
    plain = llama_cpp.Llama(model_path=str(base_file), n_ctx=512, n_threads=1, verbose=False)
    equal, near, changed, rows_out = 0, 0, 0, []
    try:
        for p in prompts:
            ours = llmkit_reply(merged, p, [-1], 32)
            theirs = greedy_llama_cpp(llm, p, 32)
            changed += greedy_llama_cpp(plain, p, 32) != theirs
            at = first_difference(ours, theirs)
            gap = None if at is None else round(top_two_gap(merged, p + ours[:at]), 4)
            equal += at is None
            near += gap is not None and gap < 0.05
            rows_out.append({"equal": at is None, "first_difference": at, "gap": gap})
    finally:
        llm.close()
        plain.close()
    out["lora"] = {"steps": steps, "adapter_bytes": adapter.stat().st_size, "prompts": len(prompts),
                   "greedy_equal_to_merged": equal, "near_ties": near, "changed_by_adapter": changed,
                   "rows": rows_out, "torch_threads": torch.get_num_threads()}


def main(ws: str, run_name: str, out_path: str) -> None:
    import torch

    import llmkit

    ws = Path(ws)
    prompts = ws.parent / "ship_prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out: dict = {"prompts": len(PROMPTS), "files": {}}
    files = {}
    for quant in QUANTS:
        folder = ws.parent / f"gguf-{quant}"
        code, text, seconds = run("export", "--from", run_name, "--format", "gguf", "--quant", quant, "--check",
                                  "--to", folder, "-w", ws, "--set", f"ship_prompts={prompts}",
                                  "--set", "ship_max_tokens=128", "--set", "probe=false")
        entry = {"exit": code, "seconds": round(seconds, 1)}
        if code == 0:
            record = json.loads((folder / "llmkit_export.json").read_text())
            entry.update(bytes=record["bytes"], ship_check=record["ship_check"])
        else:
            entry["output"] = text[-3000:]
            run("export", "--from", run_name, "--format", "gguf", "--quant", quant, "--to", folder, "-w", ws,
                "--set", "probe=false")
        files[quant] = folder / f"model-{quant}.gguf"
        out["files"][quant] = entry
        print(quant, json.dumps(entry)[:400], flush=True)
    model, tokenizer = llmkit.load(ws / run_name)
    docs = {lang: [tokenizer.document_start_ids() + tokenizer.encode(t) for t in texts]
            for lang, texts in heldout().items()}
    out["perplexity"] = {lang: {"tokens": sum(len(d) - 1 for d in ds),
                                "llmkit_fp32": nll_llmkit(model, ds),
                                **{q: nll_llama_cpp(files[q], ds) for q in QUANTS}} for lang, ds in docs.items()}
    print(json.dumps(out["perplexity"]), flush=True)
    lora(ws, run_name, files["f16"], out)
    out["torch_threads"] = torch.get_num_threads()
    Path(out_path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
