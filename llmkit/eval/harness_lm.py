"""lm-evaluation-harness's `LM` over an llmkit model: its own Transformer, KV cache and tokenizer.

Text becomes ids as lm-eval's `hf` backend makes them from the folder `llmkit export` writes, so
the two score the same ids and compare to 1e-4 (tests/eval/test_harness_parity.py):
- `tok_encode(text)` is transformers' `tokenizer(text)`: the ids its post-processor puts before a
  text (llmkit's sentencepiece tokenizer: <s>; Llama 3: <|begin_of_text|>; Qwen, SmolLM2:
  nothing), unless the text already starts with the prefix token, then the text's ids;
- the prefix of an empty context and of each rolling window is `bos`, else `eos`, as transformers'
  tokenizer config names them (`prefix_token_id`); generation adds that eos's text to `until`.
This is not `Tokenizer.document_start_ids()`, the `</s>` llmkit's own metrics start a text with:
the price of comparability with everyone else's lm-eval figures (docs/eval.md, "Published benchmarks");
`prompt_start="document"` starts texts that way instead, to compare with llmkit's `choice`.

Scoring goes through `PrefixScorer` (distinct inputs once, shared prefixes' keys and values once,
batches by length); generation is greedy (or sampled, `do_sample`) with the KV cache, a batch
of prompts of similar length at a time, each row ending at a stop id or one of its `until` strings.
Under torchrun (torch.distributed initialised), lm-eval gives each rank its share of the requests
and gathers through `all_gather` / `gather_object` here.
"""

from __future__ import annotations

import json

from lm_eval.api.model import TemplateLM
from lm_eval.api.samplers import ContextSampler

from llmkit.errors import UserError
from llmkit.eval.harness_scoring import PrefixScorer, request_ids
from llmkit.tokenizers.tokenizer_json import HFTokenizer


def hf_special_ids(tokenizer) -> tuple[list[int], int, int]:
    """(ids transformers' `tokenizer(text)` puts before a text, its prefix token id (bos, else
    eos), its eos_token_id) for the tokenizer folder `llmkit export` writes from `tokenizer`."""
    if isinstance(tokenizer, HFTokenizer):  # its own files are exported as they are
        named = tokenizer._named_ids
        eos = named.get("eos_token", tokenizer.eos_id)
        return list(tokenizer._text_start), named.get("bos_token", eos), eos
    return [tokenizer.bos_id], tokenizer.bos_id, tokenizer.eos_id  # llmkit's export adds <s>


class SubjectFirstN(ContextSampler):
    """lm-eval's `first_n` few-shot examples, taken from the evaluated document's subject first
    (then the rest of the pool): one file holding every subject gives what lm-eval's per-subject
    MMLU / CMMLU / C-Eval tasks give, each reading its own subject's dev split."""

    def sample(self, n: int, eval_doc=None, df=None, **kwargs):
        pool = [d for d in (df or self.df) if d != eval_doc]
        subject = (eval_doc or {}).get("subject")
        same = [d for d in pool if subject is not None and d.get("subject") == subject]
        chosen = (same + [d for d in pool if not (subject is not None and d.get("subject") == subject)])[:n]
        if len(chosen) < n:
            raise ValueError(f"{n} few-shot examples asked for, the few-shot split has {len(pool)}")
        return chosen


class LlmkitLM(TemplateLM):
    """lm-eval's LM interface (`loglikelihood`, `loglikelihood_rolling`, `generate_until`,
    `apply_chat_template`) over an llmkit model and its tokenizer."""

    def __init__(self, model, tokenizer, *, device=None, dtype: str = "float32", batch_tokens: int = 8192,
                 generation_batch_size: int = 16, max_gen_toks: int = 256, name: str = "llmkit",
                 prompt_start: str = "transformers"):
        import contextlib

        import torch

        super().__init__()
        self._device = device or next(model.parameters()).device
        self._model = model.to(self._device).eval()
        self.tok = tokenizer
        self.name = name
        self.text_start, self._prefix_id, self._eot_id = hf_special_ids(tokenizer)
        if prompt_start == "document":  # llmkit's own metrics' start (`choice`): to compare with them
            self.text_start = tokenizer.document_start_ids()
        self._max_length = model.config.max_seq_len
        self.max_gen_toks = max_gen_toks
        self.generation_batch_size = generation_batch_size
        cast = getattr(torch, dtype)
        self.autocast = (contextlib.nullcontext if cast == torch.float32 else
                         lambda: torch.autocast(self._device.type, dtype=cast))
        self.scorer = PrefixScorer(self._model, self._device, self.autocast, batch_tokens)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self._rank, self._world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()

    # -- what lm-eval reads -------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self._eot_id

    @property
    def prefix_token_id(self) -> int:
        return self._prefix_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return self.name.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tok.chat_template if chat_template else None

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        ids = self.tok.encode(string)
        if add_special_tokens is False:
            return ids
        if add_special_tokens is None and string.startswith(self._token_text(self._prefix_id)):
            return ids  # the text brings its own start (a rendered chat template)
        return [*self.text_start, *ids]

    def tok_decode(self, ids) -> str:
        return self.tok.decode(ids)

    def _token_text(self, token_id: int) -> str:
        return self.tok.id_to_piece(token_id)  # a special token's text, as transformers decodes it

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True) -> str:
        """The chat as the tokenizer's template renders it; without a generation prompt the last
        (assistant) message is left open for its continuation, as transformers'
        `continue_final_message` does."""
        text = self.tok.format_chat(chat_history, add_generation_prompt=add_generation_prompt)
        if not add_generation_prompt and chat_history:
            last = chat_history[-1]["content"].strip()
            end = text.rfind(last)
            if end >= 0:
                text = text[:end + len(last)]
        return text

    # -- scoring ------------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        scored = self.scorer.score([request_ids(ctx, cont, self.max_length) for _, ctx, cont in requests])
        for (key, _, _), answer in zip(requests, scored):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return scored

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood in windows of max_length ids, every id predicted once
        (lm-eval's rolling windows, the prefix token first)."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        windows, owner = [], []
        for i, (text,) in enumerate(r.args for r in requests):
            for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (lp, _) in zip(owner, self._loglikelihood_tokens(windows)):
            totals[i] += lp
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # -- generation ---------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(json.dumps(r.args[1], sort_keys=True, default=str), []).append(i)
        eot_text = self._token_text(self.eot_token_id)
        for members in groups.values():
            kwargs = dict(normalize_gen_kwargs(dict(requests[members[0]].args[1]), self.max_gen_toks))
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eot_text)
            max_new = kwargs.pop("max_gen_toks")
            room = self.max_length - max_new
            if room < 1:
                raise UserError(f"a task asks for {max_new} generated tokens, as many as the model's "
                                f"max_seq_len={self.max_length}; lower its max_gen_toks")
            prompts = {i: self.tok_encode(requests[i].args[0])[-room:] for i in members}
            order = sorted(members, key=lambda i: -len(prompts[i]))
            for start in range(0, len(order), self.generation_batch_size):
                batch = order[start:start + self.generation_batch_size]
                texts = self._generate([prompts[i] for i in batch], max_new, until, kwargs)
                for i, text in zip(batch, texts):
                    out[i] = postprocess_generated_text(text, until, None)
                    self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
        return out  # type: ignore[return-value]

    def _generate(self, prompts: list[list[int]], max_new: int, until: list[str], kwargs: dict) -> list[str]:
        """Each prompt's continuation text, up to a stop id, an `until` string or max_new tokens."""
        import torch

        from llmkit.model.decoding import KVCache, left_pad, sample_next_token

        ids, mask = left_pad(prompts, self.tok.pad_id)
        ids, mask = ids.to(self._device), mask.to(self._device)
        rows = len(prompts)
        stops = {*self.tok.stop_ids, self.eot_token_id}
        sampled = bool(kwargs.get("do_sample")) and float(kwargs.get("temperature") or 0) > 0
        generator = torch.Generator(device=self._device).manual_seed(int(kwargs.get("seed", 0))) if sampled else None
        cache = KVCache(self._model.config, rows, ids.shape[1] + max_new)
        new: list[list[int]] = [[] for _ in range(rows)]
        done = [False] * rows
        with torch.inference_mode(), self.autocast():
            hidden = self._model.hidden_states(ids, kv_cache=cache, attention_mask=mask)
            for step in range(max_new):
                logits = self._model.lm_head(hidden[:, -1]).float()
                token = sample_next_token(logits, float(kwargs.get("temperature") or 1.0), kwargs.get("top_k"),
                                          kwargs.get("top_p"), greedy=not sampled, generator=generator)
                for r, t in enumerate(token.tolist()):
                    if done[r]:
                        continue
                    if t in stops:
                        done[r] = True
                        continue
                    new[r].append(t)
                    done[r] = any(s and s in self.tok.decode(new[r]) for s in until)
                if all(done) or step == max_new - 1:
                    break
                mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=1)
                hidden = self._model.hidden_states(token[:, None], kv_cache=cache, attention_mask=mask)
        return [self.tok.decode(r) for r in new]

    # -- several ranks ------------------------------------------------------------------------

    def all_gather(self, tensor):
        import torch

        if self.world_size == 1:
            return tensor
        parts = [torch.zeros_like(tensor) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, tensor)
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj, dst=0):
        import torch

        if self.world_size == 1:
            return [obj]
        gathered = [None] * self.world_size if self.rank == dst else None
        torch.distributed.gather_object(obj, gathered, dst=dst)
        return gathered

    def barrier(self) -> None:
        import torch

        if self.world_size > 1:
            torch.distributed.barrier()
