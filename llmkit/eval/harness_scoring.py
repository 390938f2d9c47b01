"""Log-likelihood requests as lm-evaluation-harness asks them, scored with a shared-prefix KV cache.

A request is `(ids, n)`: the summed log-probability of the last n ids, each predicted from every
id before it, and whether greedy decoding would have produced them (lm-eval's `is_greedy`).

Two savings over scoring each request alone (what lm-eval's `hf` backend does at batch size 1):
- requests whose inputs (`ids[:-1]`) are equal go through the model once; a multiple-choice
  question with one-token answers (" A" … " D") is one forward pass, not four;
- inputs that start with the same long run of ids (a task's few-shot examples and header, the
  context every choice continues) are sorted next to each other; that run's keys and values are
  computed once and every tail attends to them (`SharedPrefix`), so a 5-shot prompt's examples
  are read once per subject, not once per question.
The rest is batched by length, right-padded (causal attention keeps padding from a real token),
and only the scored positions go through the LM head.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Sequence

MIN_SHARED = 16  # ids a run must share before its keys and values are computed once
HEAD_ELEMENTS = 1 << 26  # logits computed at once (256 MB in float32)


@dataclass
class Input:
    """One distinct model input and the requests that read it."""
    ids: tuple[int, ...]                                   # what goes through the model (request ids[:-1])
    scored: int = 0                                        # last positions whose predictions are read
    requests: list[tuple[int, list[int]]] = field(default_factory=list)  # (request index, target ids)


@dataclass
class Cluster:
    """Inputs that share their first `shared` ids (0: no prefix reused)."""
    inputs: list[Input]
    shared: int


def distinct_inputs(requests: Sequence[tuple[Sequence[int], int]]) -> list[Input]:
    """The requests grouped by input, sorted so that inputs with a common start are neighbours."""
    by_ids: dict[tuple[int, ...], Input] = {}
    for i, (ids, n) in enumerate(requests):
        key = tuple(ids[:-1])
        item = by_ids.setdefault(key, Input(key))
        item.scored = max(item.scored, n)
        item.requests.append((i, list(ids[-n:])))
    return [by_ids[k] for k in sorted(by_ids)]


def common_length(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(limit, len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def clusters(inputs: list[Input], min_shared: int = MIN_SHARED) -> list[Cluster]:
    """Runs of sorted inputs that share ≥ min_shared leading ids, none of them a scored position
    (the shared part ends before the first position whose prediction is read). Within a run of
    neighbours sharing at least min_shared, the cut points are those below the threshold that
    saves the most ids: a task's header shared by every question is worth less than each
    subject's few-shot examples shared by its questions."""
    if not inputs:
        return []
    shared = [min(common_length(a.ids, b.ids, len(a.ids)), len(a.ids) - a.scored, len(b.ids) - b.scored)
              for a, b in zip(inputs, inputs[1:])]  # shared[i]: inputs i and i + 1
    out: list[Cluster] = []
    for begin, end in runs(shared, 0, len(inputs), min_shared):
        best = max(set(shared[begin:end - 1]) or {0}, key=lambda t: saved(shared, begin, end, t))
        for a, b in runs(shared, begin, end, best):
            out.append(Cluster(inputs[a:b], min(shared[a:b - 1]) if b - a > 1 else 0))
    return out


def runs(shared: list[int], begin: int, end: int, threshold: int) -> list[tuple[int, int]]:
    """[a, b) ranges of inputs begin..end whose neighbours share ≥ threshold ids."""
    out, a = [], begin
    for i in range(begin, end - 1):
        if shared[i] < threshold:
            out.append((a, i + 1))
            a = i + 1
    out.append((a, end))
    return out


def saved(shared: list[int], begin: int, end: int, threshold: int) -> int:
    """Ids not recomputed when inputs begin..end are cut where neighbours share < threshold."""
    return sum((b - a - 1) * min(shared[a:b - 1]) for a, b in runs(shared, begin, end, threshold) if b - a > 1)


class SharedPrefix:
    """The KV-cache interface of `Transformer.hidden_states` over one prefix's keys and values,
    read by every row of a batch: `update` returns them joined with the batch's own."""

    def __init__(self, k: list, v: list, length: int):
        self.k, self.v, self.length = k, v, length
        self.prefix_length = length

    def update(self, layer: int, k, v):
        import torch

        rows = k.shape[0]
        return (torch.cat([self.k[layer].expand(rows, -1, -1, -1).to(k.dtype), k], dim=2),
                torch.cat([self.v[layer].expand(rows, -1, -1, -1).to(v.dtype), v], dim=2))

    def rewind(self) -> None:
        self.length = self.prefix_length  # hidden_states moves it past each batch


class PrefixScorer:
    """Scores requests with a causal LM (llmkit `Transformer` interface) on its device."""

    def __init__(self, model, device, autocast, batch_tokens: int = 8192, min_shared: int = MIN_SHARED):
        self.model, self.device, self.autocast = model, device, autocast
        self.batch_tokens, self.min_shared = batch_tokens, min_shared
        if any(t != "full_attention" for t in model.config.layer_types or ()):
            # a recurrent layer's state is not a prefix's keys and values to share: score whole
            self.min_shared = math.inf

    def score(self, requests: Sequence[tuple[Sequence[int], int]]) -> list[tuple[float, bool]]:
        """(summed log-probability, greedy) of each request's last n ids."""
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        plain: list[Input] = []
        for cluster in clusters(distinct_inputs(requests), self.min_shared):
            if cluster.shared:
                self._score_cluster(cluster, results)
            else:
                plain += cluster.inputs
        self._score_rows([(item, 0) for item in plain], None, results)
        return results  # type: ignore[return-value]

    def _score_cluster(self, cluster: Cluster, results) -> None:
        import torch

        from llmkit.model.decoding import KVCache

        prefix = cluster.inputs[0].ids[:cluster.shared]
        cache = KVCache(self.model.config, 1, len(prefix))
        with torch.inference_mode(), self.autocast():
            self.model.hidden_states(torch.tensor([prefix], device=self.device), kv_cache=cache)
        shared = SharedPrefix(cache.k, cache.v, len(prefix))
        self._score_rows([(item, cluster.shared) for item in cluster.inputs], shared, results)

    def _score_rows(self, rows: list[tuple[Input, int]], shared: SharedPrefix | None, results) -> None:
        """Score inputs from their `start`-th id on (the ids before it are `shared`), in batches of
        about batch_tokens ids, longest first."""
        rows = sorted(rows, key=lambda r: -(len(r[0].ids) - r[1]))
        past = shared.prefix_length if shared else 0
        batch: list[tuple[Input, int]] = []
        for row in rows:
            width = len((batch[0] if batch else row)[0].ids) - (batch[0] if batch else row)[1]
            if batch and (len(batch) + 1) * (width + past) > self.batch_tokens:
                self._score_batch(batch, shared, results)
                batch = []
            batch.append(row)
        if batch:
            self._score_batch(batch, shared, results)

    def _score_batch(self, batch: list[tuple[Input, int]], shared: SharedPrefix | None, results) -> None:
        import torch

        width = max(len(item.ids) - start for item, start in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        rows, cols, pair_pos, pair_target, pair_request = [], [], [], [], []
        for r, (item, start) in enumerate(batch):
            tail = item.ids[start:]
            ids[r, :len(tail)] = torch.tensor(tail)
            rows += [r] * item.scored
            cols += range(len(tail) - item.scored, len(tail))
            for index, targets in item.requests:  # a request reads the last len(targets) positions
                pair_pos += range(len(rows) - len(targets), len(rows))
                pair_target += targets
                pair_request += [index] * len(targets)
        if shared is not None:
            shared.rewind()
        with torch.inference_mode(), self.autocast():
            hidden = self.model.hidden_states(ids.to(self.device), kv_cache=shared)
            hidden = hidden[torch.tensor(rows, device=self.device), torch.tensor(cols, device=self.device)]
            logprob, greedy = self._head(hidden, torch.tensor(pair_pos), torch.tensor(pair_target))
        totals: dict[int, list] = {}
        for index, lp, hit in zip(pair_request, logprob.tolist(), greedy.tolist()):
            total = totals.setdefault(index, [0.0, True])
            total[0] += lp
            total[1] = total[1] and hit
        for index, (lp, hit) in totals.items():
            results[index] = (lp, hit)

    def _head(self, hidden, positions, targets):
        """Each (position, target) pair's log-probability (float64) and whether the target is the
        position's argmax; logits in slices of positions, as a big vocabulary times many positions
        would not fit in memory at once."""
        import torch

        step = max(1, HEAD_ELEMENTS // self.model.lm_head.weight.shape[0])
        logprob = torch.zeros(len(positions), dtype=torch.float64)
        greedy = torch.zeros(len(positions), dtype=torch.bool)
        for begin in range(0, hidden.shape[0], step):
            chosen = ((positions >= begin) & (positions < begin + step)).nonzero().squeeze(1)
            if not len(chosen):
                continue
            table = self.model.lm_head(hidden[begin:begin + step]).float().log_softmax(-1).cpu()
            local = positions[chosen] - begin
            logprob[chosen] = table[local, targets[chosen]].double()
            greedy[chosen] = table[local].argmax(-1) == targets[chosen]
        return logprob, greedy


def request_ids(context: Sequence[int], continuation: Sequence[int], max_length: int) -> tuple[list[int], int]:
    """(ids, n) of lm-eval's (context, continuation) request: cut from the left to max_length + 1
    ids, as its `hf` backend does (the last id is only ever a target)."""
    whole = [*context, *continuation][-(max_length + 1):]
    return whole, len(continuation)

