"""Tokenizer folders (`open_tokenizer`), and the sentencepiece backend: exact encode/decode
(batches: llmkit.tokenizers.chunk_cache).

`decode(encode(x)) == x` for every string: normalisation is the identity, whitespace is kept
as is, and every character outside the vocabulary falls back to its UTF-8 bytes. The one
character sentencepiece cannot give back itself — its own whitespace mark "▁" (U+2581), which
it decodes as a space — is encoded here as its three bytes instead.

BPE pieces never span two places where no piece of the vocabulary joins the two characters
(a space after a non-space is one such place, by training with split_by_whitespace). Text
cut at those places encodes, chunk by chunk, to exactly sentencepiece's ids; the chunk-cache
encoder (llmkit.tokenizers.chunk_cache) uses that to encode each distinct chunk once.

With `jieba=true` Chinese runs are first segmented into words by jieba (llmkit.tokenizers.cjk), and
pieces never cross a word boundary (training marks the boundaries, encoding encodes word by
word), so the round trip stays exact.

The interface every backend shares (`ChatEncoding`, with llmkit's own chat format) is in
llmkit.tokenizers.base; `open_tokenizer` opens a folder with the backend its files call for
(this sentencepiece `Tokenizer`, or llmkit.tokenizers.tokenizer_json's `HFTokenizer` for a `tokenizer.json`).
Training is llmkit.data.tokenizer_training.
"""

from __future__ import annotations

import copy
import shutil
from itertools import chain
from pathlib import Path
from typing import Iterable, Sequence

from llmkit.tokenizers.chunk_cache import ChunkCacheEncoder
from llmkit.errors import UserError
from llmkit.tokenizers.tokenizer_json import HFTokenizer
from llmkit.tokenizers.base import (CHAT_TEMPLATE, CONFIG_FILE, END_OF_TURN, JSON_FILE, MODEL_FILE,
                                   ROLE_TOKENS, ChatEncoding, read_config)

# the names callers import from here, some of them defined in llmkit.tokenizers.base
__all__ = ["open_tokenizer", "same_tokenizer", "tokenizer_file", "Tokenizer", "ChatEncoding",
           "CHAT_TEMPLATE", "CONFIG_FILE", "END_OF_TURN", "JSON_FILE", "MODEL_FILE", "ROLE_TOKENS",
           "UNK", "BOS", "EOS", "PAD", "WS_MARK"]

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
WS_MARK = "\u2581"        # sentencepiece's whitespace symbol "▁"


def tokenizer_file(directory) -> Path | None:
    """The file that gives a tokenizer folder its ids: tokenizer.model (sentencepiece), else
    tokenizer.json (Hugging Face); None when it has neither. A folder llmkit exported holds
    both, and its ids are the sentencepiece model's."""
    for name in (MODEL_FILE, JSON_FILE):
        if (Path(directory) / name).is_file():
            return Path(directory) / name
    return None


def open_tokenizer(directory: str | Path):
    """The tokenizer of a folder, with the backend its files call for (`tokenizer_file`)."""
    found = tokenizer_file(directory)
    if found is None:
        raise UserError(f"{directory} is not a tokenizer: it needs {MODEL_FILE} (sentencepiece) or "
                        f"{JSON_FILE} (Hugging Face), and {CONFIG_FILE}; build one with "
                        "`llmkit tokenizer` or give a model's tokenizer folder")
    if found.name == MODEL_FILE:
        return Tokenizer(directory)

    return HFTokenizer(directory)


def same_tokenizer(dir_a, dir_b) -> bool:
    """Whether two tokenizer folders give the same ids: the same backend file
    (`tokenizer_file`: tokenizer.model or tokenizer.json), byte for byte."""
    a, b = tokenizer_file(dir_a), tokenizer_file(dir_b)
    return a is not None and b is not None and a.read_bytes() == b.read_bytes()


_SMALL_BATCH_CHARS = 4096  # smaller batches go to sentencepiece directly


class Tokenizer(ChatEncoding):
    """A trained sentencepiece tokenizer artifact (`tokenizer.model` + `tokenizer_config.json`)."""

    def __init__(self, directory: str | Path):
        import sentencepiece as spm

        self.path = Path(directory)
        model, cfg = self.path / MODEL_FILE, self.path / CONFIG_FILE
        if not model.is_file() or not cfg.is_file():
            raise UserError(f"{self.path} is not a tokenizer: it needs {MODEL_FILE} and "
                            f"{CONFIG_FILE}; build one with `llmkit tokenizer`")
        self.config = read_config(cfg)
        self.sp = spm.SentencePieceProcessor(model_file=str(model))
        self.vocab_size = self.sp.get_piece_size()
        self.jieba = bool(self.config.get("jieba", False))
        self.unk_id, self.bos_id = self.sp.unk_id(), self.sp.bos_id()
        self.eos_id, self.pad_id = self.sp.eos_id(), self.sp.pad_id()
        self.role_ids = {r: self.sp.piece_to_id(t) for r, t in ROLE_TOKENS.items()}
        self.end_of_turn_id = self.sp.piece_to_id(END_OF_TURN)
        self._chunk_encoder = None

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        return cls(path)

    @property
    def _encoder(self):
        """The chunk-cache encoder (llmkit.tokenizers.chunk_cache), built on first use: its tables take
        a moment (and the first use on a machine compiles its passes)."""
        if self._chunk_encoder is None:
            self._chunk_encoder = ChunkCacheEncoder(self.sp, jieba=self.jieba)
        return self._chunk_encoder

    def encode_flat(self, texts: Sequence[str]):
        """All texts' ids concatenated (int32 numpy array) and the number of ids of each."""
        import numpy as np

        if (not self.jieba and sum(map(len, texts)) < _SMALL_BATCH_CHARS
                and not any(WS_MARK in t for t in texts)):
            # a few short texts (a chat turn): sentencepiece directly costs less than setting
            # up the batch encoder's arrays, and gives the same ids
            encoded = self.sp.encode(list(texts))
            counts = np.fromiter(map(len, encoded), np.int64, len(encoded))
            return np.fromiter(chain.from_iterable(encoded), np.int32, int(counts.sum())), counts
        return self._encoder.encode(texts)

    def encode_joined(self, joined: str, lengths):
        """`encode_flat` of the texts that make up `joined`, `lengths` characters each."""
        return self._encoder.encode_joined(joined, lengths)

    def encode_utf8(self, data, ends, end_id: int = -1):
        """`encode_flat` of the texts whose UTF-8 bytes make up `data` (a bytes-like object),
        the i-th ending at byte ends[i]; with `end_id` ≥ 0 that id follows each text and
        counts in its length."""
        return self._encoder.encode_utf8(data, ends, end_id)

    def for_another_thread(self) -> "Tokenizer":
        """This tokenizer for another thread: the same model, a chunk cache of its own that
        shares with this one the ids sentencepiece gave to new chunks."""
        twin = copy.copy(self)
        twin._chunk_encoder = self._encoder.sibling()
        return twin

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`; control tokens (<s>, </s>, <pad>) decode to nothing."""
        ids = ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids]
        return self.sp.decode(ids)

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))

    def piece_to_id(self, piece: str) -> int:
        return self.sp.piece_to_id(piece)

    def save(self, directory: str | Path) -> None:
        """Copy the tokenizer's files into `directory` (checkpoints carry their tokenizer)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in (MODEL_FILE, CONFIG_FILE):
            shutil.copyfile(self.path / name, directory / name)

