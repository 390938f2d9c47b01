"""A local model as `llmkit synth`'s generator: llmkit's decoding engine (KV cache, prompts that
repeat prefilled once, finished rows leaving the batch), seeded so that a rerun gives the same
tokens.

A generator (this one, or `llmkit.synth.client.ServerGenerator`) answers two calls:
`complete(prompts, sampling, seed)` — one `Completion` per prompt, in order — and
`yes_probability(prompts)` — how strongly the model answers yes; this one also
`answer_logprobs(prompts, answers)` (qa's grounding=likelihood). A prompt is a chat (a list of
{role, content}: its template up to the assistant's turn) or a `Raw` token prefix (Magpie).
"""

from __future__ import annotations

import contextlib

import torch

from llmkit.checkpoints.loading import load
from llmkit.errors import UserError
from llmkit.model.decode_weights import decoding_weights
from llmkit.model.decoding import generate, left_pad, prefill, reply_text
from llmkit.model.lm_scoring import LMScorer
from llmkit.model.packed_linear import packed_linears
from llmkit.synth.prompts import NO, YES
from llmkit.synth.requests import Completion, Raw, Sampling

_OPEN: dict = {}  # (path, device) -> LocalGenerator: each model loaded once per process, however many tasks


class LocalGenerator:
    """An llmkit checkpoint (a run, a step folder, an imported model) generating in batches."""

    def __init__(self, model, tokenizer, batch_size: int = 16, weights: str = "fp32"):
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        self.weights = weights  # decode.weights: what its CPU products multiply by (fp32 | bf16 | int8)
        self.stop_ids = set(tokenizer.stop_ids)
        self.special_ids = special_ids(tokenizer)
        self.tokens = 0  # tokens generated so far

    @classmethod
    def open(cls, path, device: str = "auto", batch_size: int = 16, weights: str = "fp32") -> LocalGenerator:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        key = (str(path), device)
        if key not in _OPEN:
            _OPEN[key] = cls(*load(path, device=device))
        found = _OPEN[key]
        found.batch_size, found.weights = batch_size, weights
        return found

    @contextlib.contextmanager
    def packed(self):
        """The model's products packed for decoding, through `weights` copies (converted once, kept)."""
        with decoding_weights(self.model, self.weights), packed_linears(self.model):
            yield

    def encode(self, prompt) -> list[int]:
        if isinstance(prompt, Raw):
            return list(prompt.ids)
        return self.tokenizer.encode_chat(prompt, add_generation_prompt=True)[0]

    def complete(self, prompts: list, sampling: Sampling, seed: int) -> list[Completion]:
        """A completion of each prompt. Prompts are batched shortest first (less padding; the
        copies of one prompt side by side, prefilled once); the random stream is `seed`'s, so
        the same prompts, settings and batch size give the same tokens."""
        room = self.model.config.max_seq_len - sampling.max_new_tokens
        if room < 1:
            raise UserError(f"synth max_new_tokens={sampling.max_new_tokens} leaves no room for a "
                            f"prompt in the model's max_seq_len={self.model.config.max_seq_len}")
        encoded = [self.encode(p)[-room:] for p in prompts]
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        device = next(self.model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        out: list[Completion | None] = [None] * len(prompts)
        with self.packed():
            for start in range(0, len(order), self.batch_size):
                rows = order[start:start + self.batch_size]
                ids, mask = left_pad([encoded[i] for i in rows], self.tokenizer.pad_id)
                tokens = generate(self.model, ids.to(device), sampling.max_new_tokens,
                                  temperature=sampling.temperature, top_k=sampling.top_k,
                                  top_p=sampling.top_p, greedy=sampling.temperature == 0,
                                  eos_id=self.tokenizer.end_of_turn_id,
                                  attention_mask=mask.to(device), generator=generator)
                for r, i in enumerate(rows):
                    out[i] = self._completion(tokens[r, ids.shape[1]:].tolist())
        return out

    def _completion(self, new: list[int]) -> Completion:
        end = next((k for k, t in enumerate(new) if t in self.stop_ids), None)
        reply = new if end is None else new[:end]
        self.tokens += len(reply) + (end is not None)
        return Completion(reply_text(self.tokenizer, reply, cut=end is None),
                          len(reply) + (end is not None), end is not None,
                          any(t in self.special_ids for t in reply))

    @torch.no_grad()
    def yes_probability(self, prompts: list) -> list[float]:
        """P(yes) / (P(yes) + P(no)) for the first token of the reply to each chat prompt (the
        first tokens of YES and NO's words): a verdict read from the logits, which a small
        model gives more reliably than a written one."""
        yes, no = first_tokens(self.tokenizer, YES), first_tokens(self.tokenizer, NO)
        yes, no = sorted(yes - no), sorted(no - yes)
        device = next(self.model.parameters()).device
        room = self.model.config.max_seq_len - 1
        out = []
        with self.packed():
            for start in range(0, len(prompts), self.batch_size):
                encoded = [self.encode(p)[-room:] for p in prompts[start:start + self.batch_size]]
                ids, mask = left_pad(encoded, self.tokenizer.pad_id)
                hidden, _, _ = prefill(self.model, ids.to(device), mask.to(device), ids.shape[1] + 1)
                logp = self.model.lm_head(hidden).float().log_softmax(-1)
                p_yes, p_no = logp[:, yes].logsumexp(-1), logp[:, no].logsumexp(-1)
                out += torch.sigmoid(p_yes - p_no).tolist()
        return out

    def answer_logprobs(self, prompts: list, answers: list[str]) -> list[float]:
        """The mean log-probability per token of each answer as the reply to its chat prompt."""
        scorer = LMScorer(self.model, device=next(self.model.parameters()).device)
        requests = []
        for prompt, answer in zip(prompts, answers):
            reply = self.tokenizer.encode(answer) or [self.tokenizer.end_of_turn_id]
            requests.append(((self.encode(prompt) + reply)[-scorer.max_len:], len(reply)))
        with self.packed():
            total = scorer.target_logprobs(requests)
        return [t / n for t, (_, n) in zip(total.tolist(), requests)]

    def user_turn_prefix(self) -> Raw:
        """The chat template's tokens before a user message (Magpie's pre-query template): the
        tokens two different single user turns share. Its text is recorded in the manifest."""
        return Raw(*user_turn_prefix(self.tokenizer))


def user_turn_prefix(tokenizer) -> tuple[tuple, str]:
    """(ids, text) of the template before a user message's content."""
    try:
        a = tokenizer.encode_chat([{"role": "user", "content": "Alpha"}])[0]
        b = tokenizer.encode_chat([{"role": "user", "content": "Zulu"}])[0]
    except UserError as e:
        raise UserError(f"synth --kind instructions needs the model's chat template: {e}") from None
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    ids = tuple(a[:n])
    text = tokenizer.format_chat([{"role": "user", "content": "\x00"}]).split("\x00")[0]
    return ids, text


def special_ids(tokenizer) -> set[int]:
    """Ids of the tokenizer's special tokens (role markers, turn ends, document ends)."""
    backend = getattr(tokenizer, "backend", None)
    if backend is not None:
        return {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    return {tokenizer.bos_id, tokenizer.eos_id, tokenizer.end_of_turn_id, *tokenizer.role_ids.values()}


def first_tokens(tokenizer, words) -> set[int]:
    return {ids[0] for w in words if (ids := tokenizer.encode(w))}
