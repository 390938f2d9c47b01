"""Log-likelihood of token sequences under a causal LM: the primitive that `llmkit eval`
(perplexity, multiple choice), `ppl-filter` and `quality`'s hidden-state head share, so the data
wing and eval both import it downward.

A request is `(ids, n_targets)`: the summed log-probability of the last `n_targets` ids, each
predicted from every id before it. Requests are sorted by length and cut into forward passes of
at most `batch_tokens` padded tokens; padding goes on the right, where causal attention keeps it
from reaching a real token. Only the predicted positions go through the LM head, so a long
few-shot context costs its forward pass but no [T, vocab] logits.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import numpy as np

from llmkit.errors import ConfigError

DTYPES = ("float32", "bfloat16", "float16")
HEAD_ELEMENTS = 1 << 26  # logits computed at once (256 MB in float32)


def resolve_device(name: str):
    """`auto` = the GPU when there is one, else the CPU; otherwise a torch device string."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for, but torch sees no GPU; use device=cpu")
    return device


def windows(n_tokens: int, window: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """(begin, end, n_targets) of the pieces that score a sequence of n_tokens: each token after
    the first is predicted exactly once, by the piece [begin, end) that ends with it; pieces after
    the first start `stride` tokens later than the one before, so every prediction of theirs has
    at least window - stride tokens of context (the Hugging Face strided-perplexity recipe).
    Needs 1 ≤ stride < window."""
    scored_to, begin = 1, 0
    while scored_to < n_tokens:
        end = min(begin + window, n_tokens)
        yield begin, end, end - scored_to
        scored_to = end
        begin += stride


class LMScorer:
    """A causal LM (llmkit `Transformer` interface) in eval mode on its device, ready to score."""

    def __init__(self, model, *, device="auto", dtype: str = "float32", batch_tokens: int = 8192):
        import torch

        if dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if batch_tokens < 1:
            raise ConfigError(f"batch_tokens must be ≥ 1, got {batch_tokens}")
        self.device = device if isinstance(device, torch.device) else resolve_device(device)
        self.model = model.to(self.device).eval()
        self.dtype = getattr(torch, dtype)
        self.batch_tokens = batch_tokens
        self.max_len = model.config.max_seq_len

    def autocast(self):
        import torch

        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def target_logprobs(self, requests: Sequence[tuple[Sequence[int], int]]) -> np.ndarray:
        """Summed log-probability of each request's last n_targets ids (float64 [len(requests)])."""
        for ids, n in requests:
            if not 1 <= n < len(ids) or len(ids) > self.max_len:
                raise ValueError(f"a request of {len(ids)} ids with {n} targets does not fit "
                                 f"(needs 1 ≤ targets < ids ≤ max_seq_len={self.max_len})")
        out = np.zeros(len(requests), dtype=np.float64)
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][0]))
        for batch in self._batches(order, requests):
            out[batch] = self._score_batch([requests[i] for i in batch])
        return out

    def _batches(self, order: list[int], requests) -> Iterator[list[int]]:
        batch: list[int] = []
        for i in order:
            width = len(requests[batch[0]][0]) if batch else len(requests[i][0])
            if batch and (len(batch) + 1) * width > self.batch_tokens:
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    def _score_batch(self, requests) -> np.ndarray:
        import torch

        width = max(len(ids) for ids, _ in requests) - 1  # the last id is only ever a target
        inputs = torch.zeros((len(requests), width), dtype=torch.long)
        rows, cols, targets = [], [], []
        for r, (ids, n) in enumerate(requests):
            ids = list(ids)
            inputs[r, :len(ids) - 1] = torch.tensor(ids[:-1])
            rows += [r] * n
            cols += range(len(ids) - 1 - n, len(ids) - 1)  # position t predicts ids[t + 1]
            targets += ids[-n:]
        rows_t = torch.tensor(rows, device=self.device)
        cols_t = torch.tensor(cols, device=self.device)
        targets_t = torch.tensor(targets, device=self.device)
        logprobs = []
        with torch.inference_mode(), self.autocast():
            hidden = self.model.hidden_states(inputs.to(self.device))[rows_t, cols_t]
            # [targets, vocab] logits in slices: a big vocabulary times a full batch of targets
            # would not fit in memory at once
            step = max(1, HEAD_ELEMENTS // self.model.lm_head.weight.shape[0])
            for i in range(0, len(targets), step):
                logits = self.model.lm_head(hidden[i:i + step]).float()
                logprobs.append(logits.log_softmax(-1).gather(1, targets_t[i:i + step, None]).squeeze(1))
        sums = torch.zeros(len(requests), dtype=torch.float64, device=self.device)
        return sums.index_add_(0, rows_t, torch.cat(logprobs).double()).cpu().numpy()

    def document_nll(self, docs: Sequence[Sequence[int]], window: int | None = None,
                     stride: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(summed negative log-likelihood, predicted tokens) of each sequence: every token after
        the first is predicted once; sequences longer than `window` (default the model's
        max_seq_len) go in pieces that advance by `stride` (default window // 2)."""
        window = min(window or self.max_len, self.max_len)
        stride = stride or max(1, window // 2)
        if not 1 <= stride < window:
            raise ConfigError(f"need 1 ≤ stride < window, got stride={stride}, window={window}")
        requests, owner = [], []
        for d, ids in enumerate(docs):
            for begin, end, n in windows(len(ids), window, stride):
                requests.append((ids[begin:end], n))
                owner.append(d)
        nll = np.zeros(len(docs), dtype=np.float64)
        counts = np.zeros(len(docs), dtype=np.int64)
        if requests:
            np.add.at(nll, owner, -self.target_logprobs(requests))
            np.add.at(counts, owner, [n for _, n in requests])
        return nll, counts


def text_documents(tokenizer, texts: list[str]) -> list[list[int]]:
    """`document_start_ids() + tokens + [</s>]` of each text (ppl-filter scores these too),
    encoded as `llmkit tokenize` writes documents into token shards: a special token's string
    inside a text is plain text there, so a document is scored as it would be trained on."""
    start, eos = tokenizer.document_start_ids(), tokenizer.eos_id
    ids, lengths = tokenizer.encode_flat(texts)
    ends = np.cumsum(lengths)
    return [[*start, *ids[end - n:end].tolist(), eos] for end, n in zip(ends, lengths)]
