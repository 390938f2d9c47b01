"""Tokenizers across the border. Export: `tokenizer.json` (a `PreTrainedTokenizerFast` built from
the sentencepiece model: same pieces, merges in sentencepiece's score order, byte fallback, no
dummy prefix) beside the original `tokenizer.model`, with the chat template in
tokenizer_config.json. Import: the tokenizer AutoTokenizer would use (`tokenizer.json` where the
folder has one), or a sentencepiece `tokenizer.model` when llmkit encodes with it exactly as it was
trained or llmkit made the folder."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from llmkit.errors import UserError
from llmkit.hf.folder import HF_TOKENIZER, HF_TOKENIZER_CONFIG, LLMKIT_TOKENIZER_KEY, write_json
from llmkit.tokenizers.tokenizer_json import FILES as HF_TOKENIZER_FILES, HFTokenizer
from llmkit.tokenizers.sentencepiece import END_OF_TURN, ROLE_TOKENS
from llmkit.tokenizers.base import CONFIG_FILE, MODEL_FILE, read_config
from llmkit.data.tokenizer_training import TokenizerConfig, tokenizer_config_json

# -- export ---------------------------------------------------------------------------------


def generation_config(tokenizer) -> dict:
    # generation stops at </s> and at the end of a chat turn, as llmkit's own chat generation does
    return {"bos_token_id": tokenizer.bos_id, "eos_token_id": [tokenizer.eos_id, tokenizer.end_of_turn_id],
            "pad_token_id": tokenizer.pad_id}


def write_hf_tokenizer(tokenizer, out_dir: Path, max_length: int) -> None:
    """tokenizer.model, tokenizer.json and tokenizer_config.json for AutoTokenizer; a model's own
    Hugging Face tokenizer (an imported one) is written as it came."""
    if not (tokenizer.path / "tokenizer.model").is_file():
        tokenizer.save(out_dir)
        return
    shutil.copyfile(tokenizer.path / "tokenizer.model", out_dir / "tokenizer.model")
    write_json(out_dir / HF_TOKENIZER, hf_tokenizer_json(tokenizer))
    write_json(out_dir / HF_TOKENIZER_CONFIG, hf_tokenizer_config(tokenizer, max_length))


def hf_tokenizer_json(tokenizer) -> dict:
    """A `tokenizers` serialization that encodes as the sentencepiece model does.

    sentencepiece BPE merges, at each step, the adjacent pair whose joined piece scores best; the
    equivalent merge list holds every split (left, right) of every normal piece into two normal
    pieces, ranked by the joined piece's score. With identity normalisation and no dummy prefix the
    only rewrite is space -> "▁", and no pre-tokenizer is needed (no trained piece crosses a word)."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((tokenizer.path / "tokenizer.model").read_bytes())
    normal_type, unknown_type, control_type, user_type = 1, 2, 3, 4
    pieces = proto.pieces
    vocab = {p.piece: i for i, p in enumerate(pieces)}
    normal = {p.piece for p in pieces if p.type == normal_type}
    merges = []
    for i in sorted((i for i, p in enumerate(pieces) if p.type == normal_type), key=lambda i: (-pieces[i].score, i)):
        piece = pieces[i].piece
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                  if piece[:k] in normal and piece[k:] in normal]
        merges += sorted(splits, key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
    chat_tokens = set(_chat_special_tokens(tokenizer))
    added = [{"id": i, "content": p.piece, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": p.type in (unknown_type, control_type) or p.piece in chat_tokens}
             for i, p in enumerate(pieces) if p.type in (unknown_type, control_type, user_type)]
    bos = tokenizer.id_to_piece(tokenizer.bos_id)
    add_bos = bool(tokenizer.config.get("add_bos_token", True))
    single = [{"Sequence": {"id": "A", "type_id": 0}}]
    pair = single + [{"Sequence": {"id": "B", "type_id": 1}}]
    if add_bos:
        single = [{"SpecialToken": {"id": bos, "type_id": 0}}] + single
        pair = [{"SpecialToken": {"id": bos, "type_id": 0}}, pair[0],
                {"SpecialToken": {"id": bos, "type_id": 1}}, pair[1]]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing", "single": single, "pair": pair,
                           "special_tokens": {bos: {"id": bos, "ids": [tokenizer.bos_id], "tokens": [bos]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": tokenizer.id_to_piece(tokenizer.unk_id),
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False, "vocab": vocab,
                  "merges": [[left, right] for left, right in merges]},
    }


def hf_tokenizer_config(tokenizer, max_length: int) -> dict:
    """tokenizer_config.json: special tokens, the chat template (with <s> first, as llmkit's
    encode_chat starts), and llmkit's own tokenizer config for `llmkit import`."""
    piece = tokenizer.id_to_piece
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": piece(tokenizer.bos_id), "eos_token": piece(tokenizer.eos_id),
        "unk_token": piece(tokenizer.unk_id), "pad_token": piece(tokenizer.pad_id),
        "add_bos_token": bool(tokenizer.config.get("add_bos_token", True)),
        "add_eos_token": bool(tokenizer.config.get("add_eos_token", False)),
        "add_prefix_space": False, "legacy": False, "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "chat_template": "{{ bos_token }}" + tokenizer.chat_template,
        LLMKIT_TOKENIZER_KEY: tokenizer.config,
    }


def _chat_special_tokens(tokenizer) -> list[str]:
    return [*ROLE_TOKENS.values(), END_OF_TURN]


# -- import ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelTokenizer:
    """A model folder's tokenizer, read and checked before an import writes anything: the files
    the imported run's tokenizer folder gets (a file to copy, or a JSON object to write)."""
    source: Path
    files: dict
    vocab_size: int


def model_tokenizer(src: Path, vocab_size: int) -> ModelTokenizer:
    """The tokenizer of folder `src`, as AutoTokenizer picks it: `tokenizer.json` (with its
    tokenizer_config.json and chat template, used as it is) when the folder has one, else a
    sentencepiece `tokenizer.model` that llmkit encodes with exactly as it was trained. A folder
    llmkit made (its own tokenizer, or an export: tokenizer.json built from its tokenizer.model)
    keeps its sentencepiece model. A tokenizer with fewer ids than the model's embedding is fine
    (Qwen2.5 pads its embedding), more is an error."""
    src = Path(src)
    own = _llmkit_config(src)
    if (src / MODEL_FILE).is_file() and (own is not None or not (src / HF_TOKENIZER).is_file()):
        proto = _sentencepiece_proto(src / MODEL_FILE)
        config = own if own is not None else _derived_llmkit_config(src / MODEL_FILE, proto)
        found = ModelTokenizer(src, {MODEL_FILE: src / MODEL_FILE, CONFIG_FILE: config}, len(proto.pieces))
    elif (src / HF_TOKENIZER).is_file():
        files = {name: src / name for name in HF_TOKENIZER_FILES if (src / name).is_file()}
        found = ModelTokenizer(src, files, HFTokenizer(src).vocab_size)  # reads and checks them
    else:
        raise UserError(f"{src} has no tokenizer ({MODEL_FILE} or {HF_TOKENIZER}); give one with "
                        "--tokenizer NAME_OR_PATH whose vocabulary fits the model's")
    if found.vocab_size > vocab_size:
        raise UserError(f"the tokenizer ({src}) has {found.vocab_size} tokens but the model's embedding "
                        f"has only {vocab_size}; give a matching one with --tokenizer")
    return found


def write_model_tokenizer(tokenizer: ModelTokenizer, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name, content in tokenizer.files.items():
        if isinstance(content, Path):
            shutil.copyfile(content, dest / name)
        else:
            write_json(dest / name, content)


def _llmkit_config(src: Path) -> dict | None:
    """llmkit's own tokenizer config in the folder's tokenizer_config.json: the whole file in a
    tokenizer llmkit trained, the `llmkit` key in one it exported; None in any other folder."""
    path = src / HF_TOKENIZER_CONFIG
    config = read_config(path) if path.is_file() else {}
    if {"special_tokens", "vocab_size"} <= config.keys():
        return config
    own = config.get(LLMKIT_TOKENIZER_KEY)
    return own if isinstance(own, dict) else None


def _sentencepiece_proto(path: Path):
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as e:  # protobuf's DecodeError, in its own words
        raise UserError(f"{path} is not a sentencepiece model ({e}); restore it from where the model "
                        "came from") from None
    return proto


def _derived_llmkit_config(path: Path, proto) -> dict:
    """llmkit's tokenizer config for a sentencepiece tokenizer.model that llmkit can encode with
    exactly (identity normalisation, whitespace kept, no dummy prefix, byte fallback)."""
    spec = proto.normalizer_spec
    problems = [p for p, bad in [("a dummy prefix", spec.add_dummy_prefix),
                                 (f"'{spec.name}' normalisation", spec.name != "identity"),
                                 ("whitespace collapsing", spec.remove_extra_whitespaces),
                                 ("no byte fallback", not proto.trainer_spec.byte_fallback)] if bad]
    if problems:
        raise UserError(f"{path} uses {', '.join(problems)}, which llmkit's tokenizer does not reproduce, "
                        f"and {path.parent} has no {HF_TOKENIZER}; give that tokenizer's {HF_TOKENIZER}, or an llmkit "
                        "tokenizer, with --tokenizer NAME_OR_PATH")
    return tokenizer_config_json(TokenizerConfig(vocab_size=max(300, len(proto.pieces))), path.read_bytes())
