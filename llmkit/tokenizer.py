"""The tokenizer: exact encode/decode (batches: llmkit.chunk_cache) and the chat format.

`decode(encode(x)) == x` for every string: normalisation is the identity, whitespace is kept
as is, and every character outside the vocabulary falls back to its UTF-8 bytes. The one
character sentencepiece cannot give back itself — its own whitespace mark "▁" (U+2581), which
it decodes as a space — is encoded here as its three bytes instead.

BPE pieces never span two places where no piece of the vocabulary joins the two characters
(a space after a non-space is one such place, by training with split_by_whitespace). Text
cut at those places encodes, chunk by chunk, to exactly sentencepiece's ids; the chunk-cache
encoder (llmkit.chunk_cache) uses that to encode each distinct chunk once.

With `jieba=true` Chinese runs are first segmented into words by jieba (llmkit.cjk), and
pieces never cross a word boundary (training marks the boundaries, encoding encodes word by
word), so the round trip stays exact.

The chat format (`ChatEncoding`) needs of a tokenizer only its ids and its special tokens; a
backend (`Tokenizer`: sentencepiece) gives those. Training is llmkit.tokenizer_training.
"""

from __future__ import annotations

import copy
import json
import shutil
from itertools import chain
from pathlib import Path
from typing import Iterable, Sequence

from llmkit.errors import UserError

MODEL_FILE = "tokenizer.model"
CONFIG_FILE = "tokenizer_config.json"


def same_tokenizer(dir_a, dir_b) -> bool:
    """Whether two tokenizer folders hold the same sentencepiece model, i.e. the same ids."""
    return (Path(dir_a) / MODEL_FILE).read_bytes() == (Path(dir_b) / MODEL_FILE).read_bytes()


UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
END_OF_TURN = "<|end|>"
# A turn is `<|role|>content<|end|>`; the tokenizer adds <s> before the first one. Matches
# `ChatEncoding.format_chat`, for transformers' apply_chat_template after export.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + "
    "'<|end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")

WS_MARK = "\u2581"        # sentencepiece's whitespace symbol "▁"


class ChatEncoding:
    """Texts and chats as ids, the same for every tokenizer backend.

    A backend sets `config` (its tokenizer_config.json), `bos_id`, `eos_id`, `role_ids`
    (role -> id of its token) and `end_of_turn_id`, and gives `encode_flat` and `decode`.
    """

    config: dict
    bos_id: int
    eos_id: int
    role_ids: dict[str, int]
    end_of_turn_id: int

    def encode_flat(self, texts: Sequence[str]):
        """All texts' ids concatenated (int32 numpy array) and the number of ids of each."""
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    @property
    def stop_ids(self) -> list[int]:
        """Ids that end a generated reply."""
        return [self.end_of_turn_id, self.eos_id]

    @property
    def chat_template(self) -> str:
        return self.config.get("chat_template", CHAT_TEMPLATE)

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, without <s> or </s>."""
        return self.encode_flat([text])[0].tolist()

    def document_start_ids(self) -> list[int]:
        """The ids a plain-text context starts with: `[</s>]`. Token shards hold documents
        separated by </s> and never <s>, so a pretrained model saw </s> before every document it
        learnt from; generation, perplexity, choice scoring and ppl-filter all start plain text
        this way (`document_start_ids() + encode(text)`). Chats start with <s> (`encode_chat`)."""
        return [self.eos_id]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        ids, counts = self.encode_flat(texts)
        ids = ids.tolist()
        out, pos = [], 0
        for n in counts.tolist():
            out.append(ids[pos:pos + n])
            pos += n
        return out

    def format_chat(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
        """The chat as text (no <s>): `<|user|>Hi<|end|><|assistant|>Hello<|end|>`."""
        return "".join(ROLE_TOKENS[r] + c + END_OF_TURN for r, c in _turns(messages)) + (
            ROLE_TOKENS["assistant"] if add_generation_prompt else "")

    def encode_chat(self, messages: Sequence[dict], add_generation_prompt: bool = False):
        """(ids, loss_mask): <s> then each turn; the mask is 1 on assistant content and its
        <|end|>, the tokens an SFT model learns to produce. ids == [<s>] + encode(format_chat)."""
        turns = _turns(messages)
        contents = self.encode_batch([c for _, c in turns])
        ids, mask = [self.bos_id], [0]
        for (role, _), content in zip(turns, contents):
            learn = int(role == "assistant")
            ids += [self.role_ids[role], *content, self.end_of_turn_id]
            mask += [0, *([learn] * len(content)), learn]
        if add_generation_prompt:
            ids.append(self.role_ids["assistant"])
            mask.append(0)
        return ids, mask


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
        self.config = json.loads(cfg.read_text(encoding="utf-8"))
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
        """The chunk-cache encoder (llmkit.chunk_cache), built on first use: its tables take
        a moment (and the first use on a machine compiles its passes)."""
        if self._chunk_encoder is None:
            from llmkit.chunk_cache import ChunkCacheEncoder

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


def _turns(messages: Sequence[dict]) -> list[tuple[str, str]]:
    turns = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        if role not in ROLE_TOKENS:
            raise UserError(f"message {i}: role must be one of {', '.join(ROLE_TOKENS)}, "
                            f"got {role!r}")
        if not isinstance(content, str):
            raise UserError(f"message {i} ({role}): content must be a string, got {content!r}")
        turns.append((role, content))
    return turns
