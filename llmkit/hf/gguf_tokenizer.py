"""A model's tokenizer as GGUF metadata, the way llama.cpp's convert_hf_to_gguf.py writes it: a
byte-level BPE `tokenizer.json` (Llama 3, Qwen2/3/3.5, SmolLM2) as `gpt2` with its merges and the
pre-tokenizer's llama.cpp name; a sentencepiece model (llmkit's own tokenizer) as `llama` with
its scores, token types and no space prefix. Both carry the bos/eos/pad/unk/end-of-turn ids,
add_bos/add_eos and the chat template. A vocabulary shorter than the model's embedding is padded
with unused `[PAD<id>]` tokens (llama.cpp needs one token per embedding row)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from llmkit.errors import UserError
from llmkit.hf.tokenizer import _chat_special_tokens, hf_tokenizer_json
from llmkit.tokenizers.tokenizer_json import _text_start_ids

# llama.cpp's token types (llama_token_type), the same numbers as sentencepiece's piece types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# pre-tokenizer regexes of byte-level BPE tokenizers -> llama.cpp's name for them (tokenizer.ggml.pre)
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # Qwen2's with marks (\p{M}) in words
SPLIT_NAMES = {QWEN2_SPLIT: "qwen2", LLAMA3_SPLIT: "llama-bpe", QWEN35_SPLIT: "qwen35"}


@dataclass
class GGUFVocab:
    """What `write_vocab` puts under tokenizer.* in the file."""
    model: str  # "gpt2" (byte-level BPE) or "llama" (sentencepiece)
    pre: str  # llama.cpp's pre-tokenizer name
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    scores: list[float] | None = None
    special_ids: dict[str, int] = field(default_factory=dict)  # bos, eos, pad, unk, eot
    add_bos: bool = False
    add_eos: bool = False
    chat_template: str | None = None
    notes: list[str] = field(default_factory=list)


def gguf_vocab(tokenizer, vocab_size: int) -> GGUFVocab:
    """The GGUF form of an llmkit tokenizer (sentencepiece) or an imported one (tokenizer.json)."""
    if (tokenizer.path / "tokenizer.model").is_file():
        vocab = sentencepiece_vocab(tokenizer)
    else:
        vocab = byte_level_vocab(tokenizer)
    if len(vocab.tokens) > vocab_size:
        raise UserError(f"{tokenizer.path}: the tokenizer has {len(vocab.tokens)} tokens but the model's "
                        f"embedding only {vocab_size}")
    for i in range(len(vocab.tokens), vocab_size):
        vocab.tokens.append(f"[PAD{i}]")
        vocab.token_types.append(UNUSED)
        if vocab.scores is not None:
            vocab.scores.append(-1e4)
    if tokenizer.jieba:
        vocab.notes.append("jieba word segmentation has no GGUF equivalent")
    return vocab


def write_vocab(writer, vocab: GGUFVocab) -> None:
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    writer.add_token_merges(vocab.merges)
    adders = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id, "pad": writer.add_pad_token_id,
              "unk": writer.add_unk_token_id, "eot": writer.add_eot_token_id}
    for name, token_id in vocab.special_ids.items():
        adders[name](token_id)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    if vocab.model == "llama":
        writer.add_add_space_prefix(False)  # llmkit's sentencepiece models have no dummy prefix
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)


def sentencepiece_vocab(tokenizer) -> GGUFVocab:
    """llmkit's tokenizer: pieces, scores and types as the sentencepiece model holds them, plus
    the merge list of its Hugging Face export (llama.cpp merges by score and ignores it;
    transformers' GGUF reader uses it, so both encode as sentencepiece does)."""
    from sentencepiece import sentencepiece_model_pb2


    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((tokenizer.path / "tokenizer.model").read_bytes())
    if proto.normalizer_spec.add_dummy_prefix:
        raise UserError(f"{tokenizer.path / 'tokenizer.model'} adds a dummy prefix, which llmkit's GGUF export "
                        "does not write; export --format hf instead")
    merges = [f"{a} {b}" for a, b in hf_tokenizer_json(tokenizer)["model"]["merges"]]
    # the role and end-of-turn tokens are control tokens, as in llmkit's Hugging Face export: readers
    # then know <|end|> ends a reply, and llama.cpp does not print them
    chat = set(_chat_special_tokens(tokenizer))
    return GGUFVocab(
        model="llama", pre="default", tokens=[p.piece for p in proto.pieces],
        token_types=[CONTROL if p.piece in chat else p.type for p in proto.pieces], scores=[p.score for p in proto.pieces], merges=merges,
        special_ids=dict(bos=tokenizer.bos_id, eos=tokenizer.eos_id, pad=tokenizer.pad_id,
                         unk=tokenizer.unk_id, eot=tokenizer.end_of_turn_id),
        add_bos=bool(tokenizer.config.get("add_bos_token", True)),
        add_eos=bool(tokenizer.config.get("add_eos_token", False)),
        # llmkit's chats start with <s> (encode_chat), as in its Hugging Face export
        chat_template="{{ bos_token }}" + tokenizer.chat_template)


def byte_level_vocab(tokenizer) -> GGUFVocab:
    """An imported tokenizer.json: byte-level BPE only (what llama.cpp calls gpt2)."""

    source = tokenizer.path / "tokenizer.json"
    spec = json.loads(source.read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not _uses_byte_level(spec):
        raise UserError(f"{source}: only byte-level BPE tokenizers (Llama 3, Qwen, SmolLM2) and llmkit's own "
                        f"sentencepiece tokenizer export to GGUF; this one is a {model.get('type')} model "
                        "without byte-level pre-tokenization; export --format hf instead")
    by_id = {i: t for t, i in model["vocab"].items()}
    types = {i: NORMAL for i in by_id}
    for added in spec.get("added_tokens") or []:
        by_id[added["id"]] = added["content"]
        types[added["id"]] = CONTROL if added.get("special") else USER_DEFINED
    size = max(by_id) + 1
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(size)]
    token_types = [types.get(i, UNUSED) for i in range(size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    named = {k: tokenizer.backend.token_to_id(v) for k, v in tokenizer.special_tokens.items()}
    special = dict(bos=named.get("bos_token"), eos=named.get("eos_token", tokenizer.eos_id),
                   pad=named.get("pad_token"), unk=named.get("unk_token"), eot=tokenizer.end_of_turn_id)
    starts = _text_start_ids(tokenizer.backend)
    return GGUFVocab(
        model="gpt2", pre=pre_tokenizer_name(spec.get("pre_tokenizer"), source), tokens=tokens,
        token_types=token_types, merges=merges, special_ids={k: v for k, v in special.items() if v is not None},
        add_bos=bool(starts) and starts == [special["bos"]], add_eos=bool(tokenizer.config.get("add_eos_token")),
        chat_template=tokenizer.chat_template)


def _uses_byte_level(spec: dict) -> bool:
    return '"ByteLevel"' in json.dumps(spec.get("pre_tokenizer")) or '"ByteLevel"' in json.dumps(spec.get("decoder"))


def pre_tokenizer_name(pre: dict | None, source) -> str:
    """llama.cpp's name for how a byte-level tokenizer splits text before merging: Qwen2's or
    Llama 3's regex (Split + ByteLevel without its own regex), GPT-2's (ByteLevel with it), or
    SmolLM2's (single digits, then GPT-2's). Any other split has no name llama.cpp knows."""
    parts = (pre or {}).get("pretokenizers") if (pre or {}).get("type") == "Sequence" else [pre or {}]
    kinds = [p.get("type") for p in parts]
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        name = SPLIT_NAMES.get((parts[0].get("pattern") or {}).get("Regex"))
        if name:
            return name
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"
    raise UserError(f"{source}: its pre-tokenizer ({json.dumps(pre)[:200]}) is none that llama.cpp names "
                    "(qwen2, qwen35, llama-bpe, gpt-2, smollm), so a GGUF file would split text differently; "
                    "export --format hf instead")
