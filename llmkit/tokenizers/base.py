"""What every tokenizer backend shares: the files of a tokenizer folder, and `ChatEncoding`,
the interface callers use (ids, special tokens, chats) with llmkit's own chat format.

The backends are `llmkit.tokenizers.sentencepiece.Tokenizer` (sentencepiece, what `llmkit tokenizer` trains)
and `llmkit.tokenizers.tokenizer_json.HFTokenizer` (a Hugging Face `tokenizer.json`, what public models
ship); `llmkit.tokenizers.sentencepiece.open_tokenizer` picks one by the folder's files. This module sits
below both so that the one which opens a folder can import the other without a cycle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from llmkit.errors import UserError

MODEL_FILE = "tokenizer.model"        # sentencepiece
JSON_FILE = "tokenizer.json"          # Hugging Face tokenizers
CONFIG_FILE = "tokenizer_config.json"  # special tokens, chat template (jieba on/off)

ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
END_OF_TURN = "<|end|>"
# A turn is `<|role|>content<|end|>`; the tokenizer adds <s> before the first one. Matches
# `ChatEncoding.format_chat`, for transformers' apply_chat_template after export.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + "
    "'<|end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")


def read_config(path: Path) -> dict:
    """A tokenizer folder's JSON object file (tokenizer_config.json, special_tokens_map.json); a
    UserError names the file when it is not one."""
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is unreadable ({e}); restore it from where the tokenizer came from") from None
    if not isinstance(config, dict):
        raise UserError(f"{path} holds no JSON object; restore it from where the tokenizer came from")
    return config


class ChatEncoding:
    """Texts and chats as ids, the same for every tokenizer backend.

    A backend sets `config` (its tokenizer_config.json), `bos_id`, `eos_id`, `role_ids`
    (role -> id of its token) and `end_of_turn_id`, and gives `encode_flat` and `decode`.
    The chat format here is llmkit's own (a role token per turn); a backend whose folder brings
    a jinja chat template (HFTokenizer) overrides `format_chat`, `encode_chat`,
    `chat_template` and `document_start_ids`.
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
