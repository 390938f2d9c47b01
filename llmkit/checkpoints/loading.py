"""Finding and loading checkpoints: a name in the workspace or a path, a run folder or one of
its step folders, into a model (language or reward) and the tokenizer it carries.

`llmkit.load` and every stage that starts from a checkpoint (`--from`, `--ref`, `--reward`,
eval, export) read through here; the files themselves are read by `llmkit.checkpoints.step_folders`.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import contextmanager
from pathlib import Path

from llmkit.checkpoints.step_folders import (MODEL_CONFIG, TOKENIZER, checkpoint_step_dir, load_weights,
                                resolve_step_dir, weights_file)
from llmkit.errors import ConfigError, UserError
from llmkit.model.config import ContextExtension, ModelConfig
from llmkit.tokenizers.sentencepiece import open_tokenizer
from llmkit.checkpoints.lora import ADAPTER_NAME, adapters_of, base_of, holds_adapters, load_adapters, read_config
from llmkit.model.quant import block_linears
from llmkit.core.workspace import MANIFEST, Artifact, Workspace

CHAT_STAGES = ("sft", "dpo", "kto", "ppo", "distill")  # runs trained on conversations rendered by the chat template


def load(name_or_path, device=None, workspace=None):
    """(Transformer in eval mode, Tokenizer) of a checkpoint run (its `latest`) or a step folder,
    named in `workspace` (default $LLMKIT_WORKSPACE, else ./workspace) or given as a path.

    The model is float32 on `device` (default CPU); `model(input_ids)` returns logits
    [batch, seq, vocab] and `generate` completes prompts. `model.trained_on_chats` says whether
    it was trained on chats (`trained_on_chats`): `generate` then uses the chat template."""
    root = workspace or os.environ.get("LLMKIT_WORKSPACE") or "workspace"
    model, step_dir = load_model(find_checkpoint(Workspace(root), name_or_path), device)
    tokenizer = load_tokenizer(step_dir)
    if tokenizer.vocab_size > model.config.vocab_size:  # fewer is fine: an embedding padded past the vocabulary
        raise UserError(f"{step_dir}: the tokenizer has {tokenizer.vocab_size} tokens but the model's "
                        f"vocab_size is {model.config.vocab_size}; the checkpoint's tokenizer/ folder "
                        "belongs to another model")
    model.trained_on_chats = trained_on_chats(step_dir, tokenizer)
    return model, tokenizer


def trained_on_chats(step_dir, tokenizer=None) -> bool:
    """Whether the run that wrote `step_dir` is a post-training run (CHAT_STAGES), per its
    manifest, or an imported model (its vocabulary extended or not) whose `tokenizer` has a chat
    template (an Instruct model; llama.cpp and Ollama chat with a model file that carries one, too)."""
    step_dir = Path(step_dir)
    run = next((d for d in (step_dir, step_dir.parent) if (d / MANIFEST).is_file()), None)
    stage = Artifact.open(run).stage if run is not None else None
    return stage in CHAT_STAGES or (stage in ("import", "extend-vocab")
                                    and getattr(tokenizer, "chat_template", None) is not None)


def load_model(path, device=None, quantize=None):
    """(Transformer in eval mode, the step folder it came from) of a language-model checkpoint;
    a LoRA checkpoint's adapters are merged into its base. `quantize` (`quant.on_load`'s, for a
    QLoRA run) turns the block linears into quantised layers as the checkpoint is read, so the
    float model is never resident whole beside the quantised one."""
    from llmkit.model.rope import extend_context

    step_dir = checkpoint_step_dir(path)
    if holds_adapters(step_dir):
        config = read_config(step_dir)
        check_language_model(config, step_dir)
        model = load_adapters(load_model(base_of(step_dir))[0], step_dir)  # merged: a plain Transformer
        # the run may have extended its base's context (--set model.rope_scaling): its config.json says so
        extend_context(model, ContextExtension(config.get("rope_scaling"), config.get("max_seq_len"),
                                               config.get("rope_theta")))
        if quantize is not None:
            quantize(model)
        return model.to(device or "cpu").eval(), step_dir
    state_dict, config = load_weights(step_dir)
    check_language_model(config, step_dir)
    model_config = model_config_from(config, step_dir)
    try:
        model = model_from_weights(state_dict, model_config, quantize)
    except RuntimeError as e:
        raise UserError(f"{step_dir}: model.safetensors does not fit config.json ({str(e)[:300]}); the "
                        "checkpoint is damaged or mixes two models") from None
    return model.to(device or "cpu").eval(), step_dir


def model_from_weights(state_dict: dict, model_config, quantize=None):
    """A Transformer built on the meta device and handed `state_dict`'s tensors as float32 copies of
    its own (the file's mapping ends with the load): no randomly initialised model is made to be
    overwritten (its initialisation cost more than reading the file: 3.7 s of a 135M export).
    With `quantize` (`quant.on_load`'s, for QLoRA) the block linears get the memory-mapped tensors
    themselves, read, quantised and let go one layer at a time: only the packed bytes stay, and
    the process's peak is about the file plus the quantised model, not twice the float model."""
    from llmkit.model.transformer import Transformer

    with uninitialised():
        model = Transformer(model_config)
    mapped = {f"{name}.weight" for name, _ in block_linears(model)} if quantize else set()
    model.load_state_dict(own_float32_copies(state_dict, keep=mapped), strict=True, assign=True)
    finish_from_meta(model)
    if quantize is not None:
        quantize(model)
    return model


def merged_copy(model):
    """A plain model computing what a LoRA `model` computes with its adapters on (dropout off): each
    adapted linear layer holds W + B·A·alpha/r (peft's delta, a new tensor), every other parameter
    is `model`'s own tensor. For decoding a LoRA policy through llmkit's one-call decoding steps,
    which take plain layers (a GRPO rollout). None where the adapters are not plain LoRA on float
    layers of an llmkit Transformer (DoRA, a quantised base, new token rows)."""
    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer

    adapters = adapters_of(model)
    if (not isinstance(getattr(model, "config", None), ModelConfig) or adapters is None or adapters.quant != "none"
            or adapters.peft_config.use_dora or adapters.peft_config.trainable_token_indices):
        return None
    tuners = {name: m for name, m in model.named_modules() if isinstance(m, BaseTunerLayer)}
    adapted = {f"{name}.{key}" for name, m in tuners.items() for key in m.state_dict()}
    state = {key: t for key, t in model.state_dict(keep_vars=True).items() if key not in adapted}
    with torch.no_grad():
        for name, layer in tuners.items():
            base = layer.get_base_layer()
            state[f"{name}.weight"] = base.weight + layer.get_delta_weight(ADAPTER_NAME)
            if base.bias is not None:
                state[f"{name}.bias"] = base.bias
    with uninitialised():
        copy = type(model)(model.config)  # a Transformer: its config is a ModelConfig
    copy.load_state_dict({key: t.detach() for key, t in state.items()}, strict=True, assign=True)
    finish_from_meta(copy)
    return copy.eval()


def finish_from_meta(model) -> None:
    """What a Transformer built on the meta device lacks once its state dict is assigned: one
    Parameter for a tied head and embedding (assign gave each name its own over one tensor), the
    RoPE tables and the auxiliary loss (not in the checkpoint)."""
    import torch

    from llmkit.model.transformer import rope_tables

    if model.config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.rope_cos, model.rope_sin = rope_tables(model.config)
    model.aux_loss = torch.zeros(())


SKIPPED_INITS = ("uniform_", "normal_", "trunc_normal_", "constant_", "zeros_", "ones_", "eye_", "dirac_",
                 "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
                 "sparse_")


@contextmanager
def uninitialised():
    """Modules built on the meta device with no initialisation at all (torch.nn.init's functions,
    Transformer.init_weights and its RoPE tables do nothing), for a model whose every parameter the
    checkpoint then assigns (finish_from_meta adds the tables). Even on the meta device computing
    costs: an op there (normal_, the tables' arithmetic) runs torch's Python decompositions, whose
    first call imports torch._dynamo: 1.5-2.5 s of a 135M export."""
    import torch
    from torch.nn import init

    from llmkit.model import transformer

    saved = {name: getattr(init, name) for name in SKIPPED_INITS if hasattr(init, name)}
    saved_init_weights, saved_tables = transformer.Transformer.init_weights, transformer.rope_tables
    try:
        for name in saved:
            setattr(init, name, lambda tensor, *args, **kwargs: tensor)
        transformer.Transformer.init_weights = lambda self, seed=None: None
        transformer.rope_tables = lambda cfg, device=None: (torch.empty(0), torch.empty(0))
        with torch.device("meta"):
            yield
    finally:
        for name, function in saved.items():
            setattr(init, name, function)
        transformer.Transformer.init_weights, transformer.rope_tables = saved_init_weights, saved_tables


def own_float32_copies(state_dict: dict, keep: set) -> dict:
    """`state_dict` with every tensor but those named in `keep` copied out of the file's mapping as
    float32, each once, so tied names still share one tensor."""
    import torch

    copies = {}
    for key, tensor in state_dict.items():
        if key not in keep and id(tensor) not in copies:
            copies[id(tensor)] = tensor.to(torch.float32, copy=True)
    return {key: tensor if key in keep else copies[id(tensor)] for key, tensor in state_dict.items()}


def check_language_model(config: dict, step_dir) -> None:
    """A UserError unless a step folder's config.json is an llmkit language model's."""
    from llmkit.model.reward_model import HEAD_KEY

    if config.get(HEAD_KEY):
        raise UserError(f"{step_dir} is a {config[HEAD_KEY]} model, not a language model; start from a "
                        "pretrain / sft / dpo checkpoint (a reward model loads with "
                        "llmkit.checkpoints.loading.load_reward_model)")
    if "model_type" in config:
        raise UserError(transformers_folder_message(step_dir))


def transformers_folder_message(path) -> str:
    return (f"{path} holds a Hugging Face transformers config.json; turn the folder into an llmkit "
            f"checkpoint with `llmkit import --from {path} --out NAME` first")


def load_tokenizer(step_dir):
    """The tokenizer a step folder carries (its `tokenizer/` copy)."""
    folder = Path(step_dir) / TOKENIZER
    if not folder.is_dir():
        raise UserError(f"{step_dir} has no {TOKENIZER}/ folder; llmkit checkpoints carry their tokenizer "
                        "(an imported model needs `llmkit import --tokenizer DIR`)")
    return open_tokenizer(folder)


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


def starting_weights(workspace, from_: str):
    """(input artifact, step folder) for --from: a checkpoint run (its latest) or one of its
    step folders."""
    path = Path(from_)
    if weights_file(path).is_file():
        if '"model_type"' in _text_or_empty(path / MODEL_CONFIG):  # a transformers folder: no run around it
            raise UserError(transformers_folder_message(path))
        return Artifact.open(path.parent), path
    art = workspace.artifact(from_)
    return art, resolve_step_dir(art.path)


def _text_or_empty(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def model_config_from(config: dict, path):
    """ModelConfig of a checkpoint's config.json, without llmkit's own marker keys."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    try:
        return ModelConfig(**{k: v for k, v in config.items() if k in fields})
    except (TypeError, ConfigError) as e:
        raise UserError(f"{path}: config.json is not an llmkit model config ({e})") from None


def load_reward_model(path):
    """The `RewardModel` of a checkpoint run (its latest step) or step folder, in eval mode (a LoRA
    one with its adapters merged)."""
    import torch

    from llmkit.model.transformer import Transformer
    from llmkit.model.reward_model import HEAD_KEY, REWARD_HEAD, RewardModel

    step_dir = resolve_step_dir(path)
    adapted = holds_adapters(step_dir)
    state_dict, config = (None, read_config(step_dir)) if adapted else load_weights(step_dir)
    if config.get(HEAD_KEY) != REWARD_HEAD:
        raise UserError(f"{path} is not a reward model (its config.json lacks "
                        f'"{HEAD_KEY}": "{REWARD_HEAD}"); train one with `llmkit rm`')
    if adapted:
        return load_adapters(RewardModel(load_model(base_of(step_dir))[0]), step_dir).eval()
    with uninitialised():  # every parameter comes from the file (strict), as in model_from_weights
        reward_model = RewardModel(Transformer(model_config_from(config, path)))
    reward_model.load_state_dict(own_float32_copies(state_dict, keep=set()), strict=True, assign=True)
    trunk = reward_model.trunk
    if not trunk.config.tie_embeddings:  # the trunk's unused head is no parameter of the reward model
        trunk.lm_head.weight = torch.nn.Parameter(torch.zeros(trunk.lm_head.weight.shape))
    finish_from_meta(trunk)
    return reward_model.eval()
