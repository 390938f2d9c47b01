"""Tiny fixtures shared by the sft / rm / dpo / chat tests: a tokenizer trained in a fraction of a
second on task-like sentences, a small model, task rows, and checkpoint runs in a workspace."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from llmkit.model.transformer import Transformer
from llmkit.model.config import ModelConfig
from llmkit.tokenizers.sentencepiece import CONFIG_FILE, MODEL_FILE, Tokenizer
from llmkit.data.tokenizer_training import TokenizerConfig, tokenizer_config_json, train_sentencepiece
from llmkit.checkpoints import step_folders as ckpt

LETTERS = "abcdefgh"


def task_sentences(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        word = "".join(rng.choice(LETTERS) for _ in range(4))
        out += [f"What is {a}+{b}? {a + b}", f"计算 {a}+{b} 等于 {a + b}",
                f"Reverse: {word} {word[::-1]} 反转：{word}"]
    return out


def make_tokenizer(directory: Path, vocab_size: int = 330) -> Tokenizer:
    cfg = TokenizerConfig(vocab_size=vocab_size)
    model, _ = train_sentencepiece(task_sentences(), cfg, log=lambda *a: None)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MODEL_FILE).write_bytes(model)
    (directory / CONFIG_FILE).write_text(json.dumps(tokenizer_config_json(cfg, model)))
    return Tokenizer(directory)


def tiny_model(vocab_size: int, seed: int = 0, **overrides) -> Transformer:
    shape = dict(vocab_size=vocab_size, hidden_size=32, n_layers=2, n_heads=2, n_kv_heads=1,
                 intermediate_size=64, max_seq_len=128)
    model = Transformer(ModelConfig(**{**shape, **overrides}))
    model.init_weights(seed=seed)
    return model


def constant_model(vocab_size: int):
    """Greedy decoding always picks token 0: the final norm zeroes every hidden state."""
    model = tiny_model(vocab_size, tie_embeddings=False).eval()
    with torch.no_grad():
        model.model.norm.weight.zero_()
    return model


def memorizing_model(tokenizer: Tokenizer, sequences: list[list[int]], steps: int = 60, seed: int = 0):
    """A tiny model trained (next-token loss on every token, Adam) on `sequences` of token ids until
    greedy decoding continues each of them from its prefixes: a model whose answers are known."""
    import torch.nn.functional as F

    model = tiny_model(tokenizer.vocab_size, seed=seed)
    ids = torch.full((len(sequences), max(map(len, sequences))), tokenizer.pad_id)
    labels = torch.full_like(ids, -100)
    for row, seq in enumerate(sequences):
        ids[row, :len(seq)] = labels[row, :len(seq)] = torch.tensor(seq)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        logits = model(ids)[:, :-1]
        F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100).backward()
        opt.step()
    return model.eval()


def addition_rows(n: int, seed: int = 0, start: int = 0) -> list[dict]:
    """SFT rows (prompt/response and messages alternately) with an `answer`."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        prompt, answer = f"What is {a}+{b}?", str(a + b)
        row = {"id": f"r{start + i}", "answer": answer, "messages": None, "prompt": None,
               "response": None}
        if i % 2:
            row["messages"] = [{"role": "user", "content": prompt},
                               {"role": "assistant", "content": answer}]
        else:
            row.update(prompt=prompt, response=answer)
        rows.append(row)
    return rows


def preference_rows(n: int, seed: int = 0) -> list[dict]:
    """Pairs where the chosen reply is the sum and the rejected one is off by ten."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        rows.append({"id": f"p{i}", "prompt": f"What is {a}+{b}?", "chosen": str(a + b),
                     "rejected": str(a + b + rng.choice([-10, 10])), "answer": str(a + b)})
    return rows


def separable_pairs(n: int, seed: int = 0) -> list[dict]:
    """Chosen replies are numbers, rejected ones letters: a tiny model tells them apart fast."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        rows.append({"id": f"s{i}", "prompt": f"What is {a}+{b}?", "chosen": str(a + b),
                     "rejected": "".join(rng.choice(LETTERS) for _ in range(3)),
                     "answer": str(a + b)})
    return rows


def write_dataset(ws_root: Path, name: str, rows: list[dict]) -> Path:
    """A dataset artifact (parquet + manifest) as `llmkit ingest` leaves it."""
    import pyarrow as pa

    from llmkit.data.io import DatasetWriter
    from llmkit.core.workspace import Workspace

    b = Workspace(ws_root).builder(name, stage="ingest", config={"rows": len(rows)}, quiet=True)
    with b:
        rows = [{**r, "text": r.get("prompt") or "", "source": "test"} for r in rows]
        w = DatasetWriter(b.dir)
        w.write(pa.Table.from_pylist(rows))
        w.close()
    return b.final


def write_checkpoint_run(ws_root: Path, name: str, model: torch.nn.Module, tokenizer: Tokenizer,
                         config: dict | None = None) -> Path:
    """A checkpoint-run artifact with one complete step folder, as the engine writes it."""
    import dataclasses

    from llmkit.core.workspace import Workspace

    b = Workspace(ws_root).builder(name, stage="pretrain", config={"name": name}, in_place=True,
                                   quiet=True)
    with b:
        step = b.dir / ckpt.step_dir_name(1)
        step.mkdir(parents=True)
        named = model.state_dict(keep_vars=True)
        ckpt.save_weights(step / ckpt.WEIGHTS, {k: v.detach() for k, v in named.items()},
                          ckpt.tied_groups(named))
        cfg = config if config is not None else dataclasses.asdict(model.config)
        (step / ckpt.MODEL_CONFIG).write_text(json.dumps(cfg))
        tokenizer.save(step / ckpt.TOKENIZER)
        ckpt.mark_complete(step)
    return b.final


def lora_sft_on_import(hf_folder: Path, ws: Path, system: str | None = None) -> dict:
    """Import the transformers folder `hf_folder` as `base` and train rank-4 LoRA adapters on
    twelve one-line chats (with a `system` message when given) for three steps into `sft`; returns
    the adapters' tensors (a family's LoRA test reads which modules learned)."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from llmkit.cli.app import build_app

    def invoke(*args):
        r = CliRunner().invoke(build_app(), [str(a) for a in args])
        assert r.exit_code == 0, r.output

    invoke("import", "--from", hf_folder, "--out", "base", "-w", ws)
    head = [{"role": "system", "content": system}] if system else []
    write_dataset(ws, "sft_train", [
        {"id": f"r{i}", "messages": [*head, {"role": "user", "content": f"What is {i}+{i}?"},
                                     {"role": "assistant", "content": str(2 * i)}]} for i in range(12)])
    invoke("sft", "--from", "base", "-w", ws, "--set", "lora.r=4", "--set", "max_steps=3", "--set", "warmup_steps=0",
           "--set", "micro_batch_size=2", "--set", "eval_every=0", "--set", "seq_len=256", "--set", "lr=1e-2")
    return load_file(ckpt.resolve_step_dir(ws / "sft") / "adapter_model.safetensors")
