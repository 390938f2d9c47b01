"""The Python API: load a checkpoint, generate text with it.

    import llmkit
    import torch

    model, tok = llmkit.load("sft")  # a run of ./workspace ($LLMKIT_WORKSPACE), or a path
    logits = model(torch.tensor([tok.encode("Hello")]))  # [batch, seq, vocab], float32
    print(llmkit.generate(model, tok, ["What is 12+34?"], greedy=True, max_new_tokens=16))

`load` is for causal language models; a reward-model checkpoint (config.json marked by `llmkit rm`)
loads with `llmkit.train.rm.load_reward_model`. Weights are read from safetensors only.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from llmkit.errors import ConfigError, UserError

CHAT_STAGES = ("sft", "dpo", "ppo")  # runs trained on conversations rendered by the chat template


def load(name_or_path, device=None, workspace=None):
    """(Transformer in eval mode, Tokenizer) of a checkpoint run (its `latest`) or a step folder,
    named in `workspace` (default $LLMKIT_WORKSPACE, else ./workspace) or given as a path.

    The model is float32 on `device` (default CPU); `model(input_ids)` returns logits
    [batch, seq, vocab] and `generate` completes prompts. `model.trained_on_chats` says whether
    the run was trained on chats (an sft / dpo / ppo run): `generate` then uses the chat template."""
    from llmkit.workspace import Workspace

    root = workspace or os.environ.get("LLMKIT_WORKSPACE") or "workspace"
    model, step_dir = load_model(find_checkpoint(Workspace(root), name_or_path), device)
    tokenizer = load_tokenizer(step_dir)
    if tokenizer.vocab_size != model.config.vocab_size:
        raise UserError(f"{step_dir}: the tokenizer has {tokenizer.vocab_size} tokens but the model's "
                        f"vocab_size is {model.config.vocab_size}; the checkpoint's tokenizer/ folder "
                        "belongs to another model")
    model.trained_on_chats = trained_on_chats(step_dir)
    return model, tokenizer


def trained_on_chats(step_dir) -> bool:
    """Whether the run that wrote `step_dir` is a post-training run (CHAT_STAGES), per its manifest."""
    from llmkit.workspace import MANIFEST, Artifact

    step_dir = Path(step_dir)
    run = next((d for d in (step_dir, step_dir.parent) if (d / MANIFEST).is_file()), None)
    return run is not None and Artifact.open(run).stage in CHAT_STAGES


def load_model(path, device=None):
    """(Transformer in eval mode, the step folder it came from) of a language-model checkpoint."""
    from llmkit.model import Transformer
    from llmkit.train.checkpoint import load_weights
    from llmkit.train.rm import HEAD_KEY, model_config_from

    step_dir = checkpoint_step_dir(path)
    state_dict, config = load_weights(step_dir)
    if config.get(HEAD_KEY):
        raise UserError(f"{step_dir} is a {config[HEAD_KEY]} model, not a language model; start from a "
                        "pretrain / sft / dpo checkpoint (a reward model loads with "
                        "llmkit.train.rm.load_reward_model)")
    if "model_type" in config:
        raise UserError(f"{step_dir} holds a Hugging Face transformers config.json; turn the folder into an "
                        "llmkit checkpoint with `llmkit import --from DIR --out NAME` first")
    model = Transformer(model_config_from(config, step_dir))
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as e:
        raise UserError(f"{step_dir}: model.safetensors does not fit config.json ({str(e)[:300]}); the "
                        "checkpoint is damaged or mixes two models") from None
    return model.to(device or "cpu").eval(), step_dir


def load_tokenizer(step_dir):
    """The tokenizer a step folder carries (its `tokenizer/` copy)."""
    from llmkit.tokenizer import Tokenizer
    from llmkit.train.checkpoint import TOKENIZER

    folder = Path(step_dir) / TOKENIZER
    if not folder.is_dir():
        raise UserError(f"{step_dir} has no {TOKENIZER}/ folder; llmkit checkpoints carry their tokenizer "
                        "(an imported model needs `llmkit import --tokenizer DIR`)")
    return Tokenizer(folder)


def checkpoint_step_dir(path) -> Path:
    """The step folder `path` names: itself, or a run's `latest` (else newest complete) step."""
    from llmkit.train.checkpoint import is_complete, resolve_step_dir, step_dirs, step_of

    path = Path(path)
    if not path.exists():
        raise UserError(f"{path} does not exist; give a checkpoint run (a folder of step-* folders) or "
                        "one of its step-* folders")
    if step_of(path) is not None and not is_complete(path):
        raise UserError(f"{path} has no 'complete' marker: its save was interrupted; use another step "
                        f"of {path.parent} or the run folder itself")
    if step_of(path) is None and not (path / "model.safetensors").is_file():
        started = step_dirs(path)
        if started and not any(is_complete(p) for p in started):
            raise UserError(f"{path} holds no complete checkpoint yet ({len(started)} interrupted save(s)); "
                            "resume training with the same command to write one")
    return resolve_step_dir(path)


def find_checkpoint(workspace, name_or_path) -> Path:
    """A checkpoint named in the workspace (`sft`), or a path to a run or step folder."""
    return find_in_workspace(workspace, name_or_path, "checkpoint",
                             "train one first (see `llmkit status`) or give a run or step folder")


def find_in_workspace(workspace, name_or_path, what: str, hint: str) -> Path:
    """`workspace/name_or_path` when it exists (an artifact name such as `sft` or `export/hf`),
    else `name_or_path` as a path; a UserError saying where it looked, and `hint`, when neither."""
    path = Path(name_or_path)
    places = [path] if path.is_absolute() else [workspace.root / path, path]
    for place in places:
        if place.exists():
            return place
    looked = f"neither {places[0]} nor {path} exists" if len(places) == 2 else f"{path} does not exist"
    raise UserError(f"no {what} {str(name_or_path)!r}: {looked}; {hint}")


# -- generation -----------------------------------------------------------------------------


@dataclass
class GenerateConfig:
    max_new_tokens: int = 128  # tokens generated per prompt at most
    temperature: float = 1.0  # softmax temperature; 0 means greedy
    top_k: int | None = None  # sample among the k likeliest tokens only; None = all
    top_p: float = 1.0  # sample among the likeliest tokens whose probabilities sum to top_p
    greedy: bool = False  # always take the likeliest token (temperature, top_k, top_p unused)
    seed: int = 0  # sampling seed: the same seed, prompts and batch_size give the same text
    chat: bool | None = None  # wrap each prompt as a user turn of the chat template; None: when the
    #                           checkpoint was trained on chats (an sft / dpo / ppo run)
    batch_size: int = 8  # prompts generated together (left-padded)
    device: str = "auto"  # auto (cuda when available), cpu, cuda, cuda:N

    def __post_init__(self):
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ConfigError("generate max_new_tokens and batch_size must be >= 1")
        if self.temperature < 0:
            raise ConfigError(f"generate temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"generate top_k must be >= 1 or none, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"generate top_p must be in (0, 1], got {self.top_p}")


def generate_texts(model, tokenizer, prompts: list, cfg: GenerateConfig) -> list[dict]:
    """One record per prompt: `prompt`, `completion` (the text after the prompt, up to a stop
    token), `new_tokens`, `stopped` (a stop token ended it) and `prompt_truncated`.

    A prompt is a string (plain text, or a user turn when chat) or a list of chat messages; chat
    is cfg.chat, or when that is None `model.trained_on_chats` (set by `load`).
    Prompts longer than max_seq_len - max_new_tokens keep their last tokens."""
    import torch

    from llmkit.decoding import generate

    room = model.config.max_seq_len - cfg.max_new_tokens
    if room < 1:
        raise ConfigError(f"generate max_new_tokens={cfg.max_new_tokens} leaves no room for a prompt in the "
                          f"model's max_seq_len={model.config.max_seq_len}; lower it")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    template = cfg.chat if cfg.chat is not None else getattr(model, "trained_on_chats", False)
    chat = template or any(not isinstance(p, str) for p in prompts)
    stop_ids = set(tokenizer.stop_ids)
    records = []
    for start in range(0, len(prompts), cfg.batch_size):
        batch = prompts[start:start + cfg.batch_size]
        encoded = [encode_prompt(tokenizer, p, template) for p in batch]
        width = min(room, max(map(len, encoded)))
        ids = torch.full((len(batch), width), tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt_ids in enumerate(encoded):
            kept = prompt_ids[-width:]
            ids[row, width - len(kept):] = torch.tensor(kept)
            mask[row, width - len(kept):] = 1
        out = generate(model, ids.to(device), cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k,
                       top_p=cfg.top_p, greedy=cfg.greedy,
                       eos_id=tokenizer.end_of_turn_id if chat else tokenizer.eos_id,
                       attention_mask=mask.to(device), generator=generator)
        for prompt, prompt_ids, new in zip(batch, encoded, out[:, width:].tolist()):
            end = next((i for i, t in enumerate(new) if t in stop_ids), None)
            records.append({"prompt": prompt, "completion": tokenizer.decode(new[:end]),
                            "new_tokens": len(new) if end is None else end + 1, "stopped": end is not None,
                            "prompt_truncated": len(prompt_ids) > width})
    return records


def generate(model, tokenizer, prompts, **options):
    """The completions of `prompts` (a list of strings or chat message lists; one string gives one
    completion), each the text after its prompt up to a stop token. `options` are GenerateConfig's
    (max_new_tokens, temperature, top_k, top_p, greedy, seed, chat, batch_size); by default a
    model `load` read from an sft / dpo / ppo run is prompted through its chat template."""
    from llmkit.config import resolve_config

    if "device" in options:
        raise ConfigError("generate runs where the model is: load it with llmkit.load(..., device=) or "
                          "move it with model.to(device)")
    cfg = resolve_config(GenerateConfig, options)
    records = generate_texts(model, tokenizer, [prompts] if isinstance(prompts, str) else list(prompts), cfg)
    completions = [r["completion"] for r in records]
    return completions[0] if isinstance(prompts, str) else completions


def encode_prompt(tokenizer, prompt, chat: bool) -> list[int]:
    """Token ids a generation starts from: the chat template up to the assistant's turn for a
    message list (or any prompt when `chat`), else the text after `Tokenizer.document_start_ids()`
    (`</s>`, what a pretrained model saw before every document)."""
    if not isinstance(prompt, str):
        return tokenizer.encode_chat(prompt, add_generation_prompt=True)[0]
    if chat:
        return tokenizer.encode_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)[0]
    return tokenizer.document_start_ids() + tokenizer.encode(prompt)


def read_prompts(path) -> list:
    """Prompts from a .jsonl file (each line an object with `prompt`, or `messages` for a chat)
    or any other text file (each non-empty line a prompt)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--prompts {path}: cannot read it ({e})") from None
    if path.suffix != ".jsonl":
        return [line for line in lines if line.strip()]
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise UserError(f"{path}:{n}: not valid JSON ({e})") from None
        prompt = record.get("messages", record.get("prompt")) if isinstance(record, dict) else None
        if not isinstance(prompt, (str, list)):
            raise UserError(f"{path}:{n}: each line needs a `prompt` string or a `messages` list")
        prompts.append(prompt)
    return prompts


def run_generate(ctx, cfg: GenerateConfig, source: str, prompts: list, output=None) -> list[dict]:
    """`llmkit generate`: print a completion of every prompt (and write them to `output` as jsonl)."""
    import torch

    if not prompts:
        raise UserError("no prompts: give --prompt TEXT (repeatable) or --prompts FILE")
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load(source, device=device, workspace=ctx.workspace.root)
    if cfg.chat is None and model.trained_on_chats:
        print(f"{source} was trained on chats: prompts go through the chat template (--set chat=false "
              "for plain text)", file=sys.stderr)
    records = generate_texts(model, tokenizer, prompts, cfg)
    for record in records:
        shown = record["prompt"] if isinstance(record["prompt"], str) else record["prompt"][-1]["content"]
        print(f">>> {shown}\n{record['completion']}\n")
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return records
