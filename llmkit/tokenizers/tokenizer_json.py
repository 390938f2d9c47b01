"""The Hugging Face backend: a folder with `tokenizer.json` (the `tokenizers` library) and
`tokenizer_config.json`, what public models ship (Qwen2.5/3, Llama 3.x, SmolLM2, Mistral).

Ids are those of transformers' `AutoTokenizer` on the same folder with
`add_special_tokens=False`: `encode` adds nothing around a text, and `encode_chat` tokenizes the
rendered chat as `apply_chat_template(tokenize=True)` does. Documents of a corpus (`encode_flat`,
`encode_utf8`: what `llmkit tokenize` writes) are plain text, special tokens' strings included
(`split_special_tokens=True`), as llmkit's own tokenizer reads `</s>` in text: the only document
end in token shards is the one written after each document. `decode` drops the special tokens
(those tokenizer.json marks special: <|im_end|>, <|begin_of_text|>, …), as the sentencepiece
backend drops its control tokens.

Special tokens are those tokenizer_config.json names (a string or an AddedToken dict; for a
folder saved before `added_tokens_decoder` existed, special_tokens_map.json's). A model may have
no bos (Qwen); pad falls back to the document end. A chat model has two ends:
- document end (`eos_id`), what separates pretraining documents: the first of <|endoftext|>,
  <|end_of_text|> and </s> that is a special token, else the config's eos_token. Chat configs
  name their end of turn as eos (Qwen2.5-Instruct <|im_end|>, Llama-3-Instruct <|eot_id|>) while
  their documents end with <|endoftext|> / <|end_of_text|>;
- end of turn (`end_of_turn_id`), what ends an assistant reply: the special token the chat
  template writes right after a reply's content (found by rendering a probe conversation), else
  the config's eos_token.
`stop_ids` holds both. A plain-text context starts (`document_start_ids`) with what the
tokenizer itself puts before a text (its post-processor: Llama 3's <|begin_of_text|>, Mistral's
<s>), the token the model saw before every document it was pretrained on; a tokenizer that puts
nothing there (Qwen, SmolLM2) starts it with the document end, which came before each document
in its packed pretraining sequences.

The loss mask of a chat is 1 on each assistant reply as rendered plus its end of turn
(llmkit.tokenizers.chat_template says how the replies are found).
"""

from __future__ import annotations

import shutil
from functools import cached_property
from pathlib import Path
from typing import Iterable, Sequence

from llmkit.tokenizers.chat_template import (TEMPLATE_FILE, chat_template_of, checked_messages, end_of_turn_after_reply,
                                  has_generation_blocks, reply_spans, render_chat)
from llmkit.errors import UserError
from llmkit.tokenizers.base import CONFIG_FILE, JSON_FILE, ChatEncoding, read_config

SPECIAL_TOKENS_FILE = "special_tokens_map.json"
FILES = (JSON_FILE, CONFIG_FILE, TEMPLATE_FILE, SPECIAL_TOKENS_FILE)  # what `save` copies
# the special tokens a chat template sees, as transformers' special_tokens_map names them
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
DOCUMENT_ENDS = ("<|endoftext|>", "<|end_of_text|>", "</s>")


class HFTokenizer(ChatEncoding):
    """A Hugging Face tokenizer folder (`tokenizer.json` + `tokenizer_config.json`)."""

    def __init__(self, directory: str | Path):
        from tokenizers import Tokenizer as Backend

        self.path = Path(directory)
        model, cfg = self.path / JSON_FILE, self.path / CONFIG_FILE
        if not model.is_file() or not cfg.is_file():
            raise UserError(f"{self.path} is not a Hugging Face tokenizer: it needs {JSON_FILE} and "
                            f"{CONFIG_FILE} (as transformers' save_pretrained writes them)")
        self.config = read_config(cfg)
        try:
            self.backend = Backend.from_file(str(model))
        except Exception as e:  # the library says what is wrong in its own words
            raise UserError(f"{model} does not load with the tokenizers library: {e}") from None
        # a tokenizer.json may pad or truncate; ids here are always the whole text's
        self.backend.no_padding()
        self.backend.no_truncation()
        self.special_tokens = _named_tokens(self.path, self.config)
        self._named_ids = {name: self._id_of(name) for name in self.special_tokens}
        self.vocab_size = self.backend.get_vocab_size(with_added_tokens=True)
        self.jieba = False
        self.role_ids: dict[str, int] = {}  # chats follow the template, not role tokens
        self.bos_id, self.unk_id = self._named_ids.get("bos_token"), self._named_ids.get("unk_token")
        self.eos_id = self._document_end_id()
        self.pad_id = self._named_ids.get("pad_token", self.eos_id)
        self._template = chat_template_of(self.path, self.config)
        self._text_start = _text_start_ids(self.backend)

    # -- special tokens ---------------------------------------------------------------------

    def _id_of(self, name: str) -> int:
        text = self.special_tokens[name]
        found = self.backend.token_to_id(text)
        if found is None:
            raise UserError(f"{self.path / CONFIG_FILE}: {name} {text!r} is not a token of "
                            f"{self.path / JSON_FILE}; name one of its tokens there (are the two files from "
                            "different tokenizers?)")
        return found

    @cached_property
    def _special_texts(self) -> list[str]:
        return [t.content for t in self.backend.get_added_tokens_decoder().values() if t.special]

    def _document_end_id(self) -> int:
        for text in DOCUMENT_ENDS:
            if text in self._special_texts:
                return self.backend.token_to_id(text)
        eos = self._named_ids.get("eos_token")
        if eos is None:
            raise UserError(f"{self.path / CONFIG_FILE} names no eos_token and {JSON_FILE} has none of "
                            f"{', '.join(DOCUMENT_ENDS)}: nothing can end a document; set eos_token")
        return eos

    @cached_property
    def end_of_turn(self) -> str:
        """The text of the token that ends an assistant reply (see the module docstring)."""
        found = self._template and end_of_turn_after_reply(self._template, self.special_tokens,
                                                           self._special_texts)
        return found or self.special_tokens.get("eos_token") or self.backend.id_to_token(self.eos_id)

    @cached_property
    def end_of_turn_id(self) -> int:
        return self.backend.token_to_id(self.end_of_turn)

    def document_start_ids(self) -> list[int]:
        """What a plain-text context starts with: the tokenizer's own start of a text (Llama 3:
        `[<|begin_of_text|>]`), else `[document end]` (Qwen: `[<|endoftext|>]`)."""
        return list(self._text_start) or [self.eos_id]

    # -- texts ------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Ids of `text` as transformers' `tokenizer(text, add_special_tokens=False)` gives them: no
        special token added around it, and a special token's string in it is that token (a
        prompt may hold them; a corpus's documents go through `encode_flat`)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch_fast(list(texts), add_special_tokens=False)]

    @cached_property
    def _corpus_backend(self):
        """The backend that reads special tokens' strings as plain text (transformers'
        split_special_tokens=True): a web page quoting <|endoftext|> is not two documents."""
        from tokenizers import Tokenizer as Backend

        backend = Backend.from_str(self.backend.to_str())
        backend.encode_special_tokens = True
        return backend

    def encode_flat(self, texts: Sequence[str], end_id: int = -1):
        """All texts' ids concatenated (int32 numpy array) and the number of ids of each; with
        `end_id` ≥ 0 that id follows each text and counts in its length. The texts are a corpus's
        documents: a special token's string in them is plain text, unlike in `encode`."""
        import numpy as np

        # encode_batch_fast: the library's parallel batch encoder, without the offsets
        encodings = self._corpus_backend.encode_batch_fast(list(texts), add_special_tokens=False)
        flat, counts = [], np.empty(len(encodings), np.int64)
        for k, encoding in enumerate(encodings):
            ids = encoding.ids
            flat += ids
            if end_id >= 0:
                flat.append(end_id)
            counts[k] = len(ids) + (end_id >= 0)
        return np.array(flat, np.int32), counts

    def encode_utf8(self, data, ends, end_id: int = -1):
        """`encode_flat` of the texts whose UTF-8 bytes make up `data` (a bytes-like object),
        the i-th ending at byte ends[i]; with `end_id` ≥ 0 that id follows each text and
        counts in its length."""
        raw = memoryview(data).cast("B")
        ends = [int(e) for e in ends]
        if ends and ends[-1] != len(raw):
            raise ValueError(f"the texts end at byte {ends[-1]}, the data at {len(raw)}")
        texts = [str(raw[a:b], "utf-8") for a, b in zip([0, *ends[:-1]], ends)]
        return self.encode_flat(texts, end_id)

    def for_another_thread(self) -> "HFTokenizer":
        """Itself: a `tokenizers` tokenizer may encode in several threads at once (its corpus
        backend is built here, before the threads share it)."""
        self._corpus_backend
        return self

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`; special tokens (tokenizer.json's `special`) decode to nothing."""
        ids = ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids]
        return self.backend.decode(ids, skip_special_tokens=True)

    def id_to_piece(self, i: int) -> str:
        return self.backend.id_to_token(int(i))

    def piece_to_id(self, piece: str) -> int | None:
        """The id of a token of the vocabulary, None for any other string."""
        return self.backend.token_to_id(piece)

    # -- chats ------------------------------------------------------------------------------

    @property
    def chat_template(self) -> str | None:
        return self._template

    def _require_template(self) -> str:
        if self._template is None:
            raise UserError(f"{self.path} has no chat template (no {TEMPLATE_FILE}, no chat_template in "
                            f"{CONFIG_FILE}), so it cannot render chats: use the tokenizer of the "
                            f"model's instruct/chat version, or write the template to "
                            f"{self.path / TEMPLATE_FILE}")
        return self._template

    def format_chat(self, messages: Sequence[dict], add_generation_prompt: bool = False, **template_kwargs) -> str:
        """The chat as the template renders it (bos included when the template writes it);
        `template_kwargs` are the template's switches, as apply_chat_template takes them
        (`enable_thinking=False`)."""
        return render_chat(self._require_template(), checked_messages(messages), add_generation_prompt,
                           self.special_tokens, source=str(self.path), template_kwargs=template_kwargs)[0]

    def encode_chat(self, messages: Sequence[dict], add_generation_prompt: bool = False, **template_kwargs):
        """(ids, loss_mask): ids are the rendered chat's (= apply_chat_template(tokenize=True));
        the mask is 1 on each assistant reply and its end of turn, the tokens an SFT model
        learns to produce ({% generation %} blocks, when the template has them)."""
        template, messages = self._require_template(), checked_messages(messages)
        tracked = has_generation_blocks(template)
        text, spans = render_chat(template, messages, add_generation_prompt, self.special_tokens,
                                  track_generation=tracked, source=str(self.path), template_kwargs=template_kwargs)
        if not tracked:
            spans = reply_spans(text, messages, self.end_of_turn, source=str(self.path))
        encoding = self.backend.encode(text, add_special_tokens=False)
        return encoding.ids, token_mask(encoding.offsets, spans)

    def save(self, directory: str | Path) -> None:
        """Copy the tokenizer's files into `directory` (checkpoints carry their tokenizer)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            if (self.path / name).is_file():
                shutil.copyfile(self.path / name, directory / name)


def token_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[int]:
    """1 for each token whose characters overlap one of `spans` (in order), as transformers'
    return_assistant_tokens_mask marks them."""
    mask, k = [0] * len(offsets), 0
    for t, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        mask[t] = int(end > spans[k][0])
    return mask


def _named_tokens(directory: Path, config: dict) -> dict[str, str]:
    """bos_token, eos_token, … -> the token's text, as transformers reads them."""
    named = dict(config)
    legacy = directory / SPECIAL_TOKENS_FILE
    if "added_tokens_decoder" not in config and legacy.is_file():
        named.update(read_config(legacy))
    out = {}
    for name in NAMED_TOKENS:
        value = named.get(name)
        text = value.get("content") if isinstance(value, dict) else value
        if isinstance(text, str) and text:
            out[name] = text
    return out


def _text_start_ids(backend) -> list[int]:
    """The ids the tokenizer's post-processor puts before a text (what transformers'
    `tokenizer(text)` starts with)."""
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    for k in range(len(full) - len(plain) + 1):
        if full[k:k + len(plain)] == plain:
            return full[:k]
    return []
