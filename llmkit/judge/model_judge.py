"""The model judge: a language model compares two replies to one prompt, as a rater does on the
judging page, and `llmkit judge --model RUN` writes its verdicts into a session's journal.

A comparison is asked twice, with the replies in both orders (the first shown as reply A, then
as reply B), through a rubric in the prompt's language (Chinese when its script is mostly Han,
else English; `RUBRICS`). The verdict of each order is read from the judge's next-token
probabilities over the answer labels A, B and C (equally good) — never from generated text, so
a small model that would ramble still answers: each label's probability is that of its token
with and without a leading space, renormalised over the labels offered. The two orders then
give one verdict (`combine`): `agree` keeps a side only when both orders pick it (a model that
picks a position, not a reply, gets a tie), `mean` takes the likeliest outcome of the two
orders' probabilities averaged. The position-bias rate of a judge is the share of its
comparisons whose verdict flips with the order (`llmkit.judge.agreement`).

`judge_pairs(model, tokenizer, [(prompt, reply_a, reply_b), ...])` is the library entry point
(`llmkit synth --kind pairs` judges its samples with it); `llmkit.judge.model_rating` is the
command's use of it, a session's items judged into its journal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmkit.errors import ConfigError, UserError
from llmkit.tokenizers.cjk import language_of
from llmkit.generation import GenerateConfig, uses_chat_template
from llmkit.model.decode_weights import DecodeConfig, decoding_weights

LABELS = ("A", "B", "C")  # reply A better, reply B better, equally good
RUBRICS = {
    "en": ("Compare two replies to the same request and decide which one is better. Judge correctness "
           "first, then helpfulness, relevance and clarity. Do not let the length of a reply or the "
           "order of the replies decide.\n\n[Request]\n{prompt}\n\n[Reply A]\n{a}\n\n[Reply B]\n{b}\n\n"
           "{question}"),
    "zh": ("比较同一请求的两个回答，判断哪个更好。先看是否正确，再看是否有帮助、切题、清楚。"
           "不要因为回答的长短或先后顺序而偏向任何一个。\n\n【请求】\n{prompt}\n\n【回答 A】\n{a}\n\n"
           "【回答 B】\n{b}\n\n{question}"),
}
QUESTIONS = {  # (ties offered, A or B only)
    "en": ("Answer with one letter: A if reply A is better, B if reply B is better, C if they are "
           "equally good.", "Answer with one letter: A if reply A is better, B if reply B is better."),
    "zh": ("只用一个字母回答：回答 A 更好答 A，回答 B 更好答 B，两者一样好答 C。",
           "只用一个字母回答：回答 A 更好答 A，回答 B 更好答 B。"),
}
PLAIN_ANSWER = {"en": "\n\nAnswer:", "zh": "\n\n答案："}  # ends the rubric of a judge without a chat template
COMBINE = ("agree", "mean")


@dataclass
class ModelJudgeConfig:
    ties: bool = True  # offer "equally good" (label C); false: A or B only (a tie then only when the orders disagree)
    combine: str = "agree"  # agree: a side wins when both orders pick it, else a tie; mean: the likeliest outcome of the two orders' probabilities averaged
    language: str = "auto"  # the rubric's language: auto (zh when the prompt's script is mostly Han, else en), en, zh
    chat: bool | None = None  # ask through the judge's chat template; None: when it was trained on chats (as generate decides)
    max_reply_chars: int = 2000  # each reply is cut to this many characters in the rubric
    batch_size: int = 8  # rubrics scored together (right-padded: causal attention never sees the padding)
    device: str = "auto"  # auto (cuda when available), cpu, cuda, cuda:N
    rater: str = ""  # the rater the journal records; "" = model:<RUN>
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # decode.weights=bf16|int8: the rubrics' CPU products

    def __post_init__(self):
        if self.combine not in COMBINE:
            raise ConfigError(f"model_judge.combine must be one of {', '.join(COMBINE)}, got {self.combine!r}")
        if self.language not in ("auto", *RUBRICS):
            raise ConfigError(f"model_judge.language must be auto, en or zh, got {self.language!r}")
        if self.max_reply_chars < 1 or self.batch_size < 1:
            raise ConfigError("model_judge.max_reply_chars and batch_size must be >= 1")


@dataclass
class PairVerdict:
    """What the judge said of one (prompt, reply_a, reply_b)."""

    choice: str  # "a", "b" or "tie"
    p_a: float  # P(reply a better), averaged over both orders (the labels' probabilities renormalised)
    p_b: float
    p_tie: float  # 0 when ties are not offered
    orders: tuple[str, str]  # each order's verdict ("a", "b", "tie"): a shown as reply A, then as reply B
    probs: tuple[tuple[float, ...], tuple[float, ...]]  # each order's probabilities of the labels offered, as shown
    label_mass: float  # share of the next-token probability on the labels (mean of both orders): low = the judge did not see a question it answers with a letter
    lang: str  # the rubric's language
    truncated: bool = False  # a rubric longer than the judge's context lost its start

    @property
    def flipped(self) -> bool:
        """The two orders disagree: a position-biased comparison."""
        return self.orders[0] != self.orders[1]

    def as_record(self, names: dict | None = None) -> dict:
        """As JSON, the replies named by `names` ({"a": "left", "b": "right"} in a journal)."""
        names = {"a": "a", "b": "b", "tie": "tie", **(names or {})}
        return {"choice": names[self.choice], "orders": [names[o] for o in self.orders],
                "probs": [list(p) for p in self.probs], f"p_{names['a']}": self.p_a,
                f"p_{names['b']}": self.p_b, "p_tie": self.p_tie, "label_mass": self.label_mass,
                "lang": self.lang, **({"truncated": True} if self.truncated else {})}


# -- the rubric ------------------------------------------------------------------------------

def prompt_text(prompt) -> str:
    """A chat prompt's last user turn; a text prompt as it is."""
    return [m["content"] for m in prompt if m["role"] == "user"][-1] if isinstance(prompt, list) else prompt


def rubric_language(prompt: str, language: str = "auto") -> str:
    if language != "auto":
        return language
    return "zh" if language_of(prompt) == "zh" else "en"


def rubric(prompt: str, a: str, b: str, lang: str, ties: bool = True, max_reply_chars: int = 2000) -> str:
    """The question the judge answers with a label: `a` shown as reply A, `b` as reply B."""
    return RUBRICS[lang].format(prompt=prompt.strip(), a=a.strip()[:max_reply_chars],
                                b=b.strip()[:max_reply_chars], question=QUESTIONS[lang][0 if ties else 1])


def rubric_ids(tokenizer, text: str, lang: str, chat: bool) -> list[int]:
    """The ids whose next token is the label: the chat template up to the assistant's turn, or
    plain text ending in "Answer:"."""
    if chat:
        return tokenizer.encode_chat([{"role": "user", "content": text}], add_generation_prompt=True)[0]
    return tokenizer.document_start_ids() + tokenizer.encode(text + PLAIN_ANSWER[lang])


def label_ids(tokenizer, labels=LABELS) -> list[list[int]]:
    """Each label's candidate token ids: the first token of the label alone and after a space
    (byte-level BPE and sentencepiece spell a word's first letter either way), leaving out any
    id two labels share (a bare "▁" that sentencepiece puts before a letter says nothing)."""
    firsts = [{ids[0] for ids in (tokenizer.encode(v) for v in (label, " " + label)) if ids} for label in labels]
    shared = {i for n, ids in enumerate(firsts) for m, other in enumerate(firsts) if n != m for i in ids & other}
    out = [sorted(ids - shared) for ids in firsts]
    missing = [label for label, ids in zip(labels, out) if not ids]
    if missing:
        raise UserError(f"the judge's tokenizer has no token of its own for the answer label(s) "
                        f"{', '.join(missing)}: it cannot be read as a judge")
    return out


# -- scoring ---------------------------------------------------------------------------------

def label_probabilities(model, tokenizer, contexts: list[list[int]], labels: list[list[int]],
                        batch_size: int = 8) -> tuple[list[list[float]], list[float]]:
    """(per context: each label's probability as the next token, renormalised over the labels;
    per context: the labels' share of the whole next-token distribution). Contexts go right-padded
    in batches of similar length: each row's logits are read at its own last token, which causal
    attention computed without looking at the padding after it."""
    import torch

    device = next(model.parameters()).device
    pad = getattr(tokenizer, "pad_id", None) or 0
    probs: list = [None] * len(contexts)
    mass: list = [None] * len(contexts)
    order = sorted(range(len(contexts)), key=lambda i: -len(contexts[i]))
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            width = max(len(contexts[i]) for i in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            for r, i in enumerate(rows):
                ids[r, :len(contexts[i])] = torch.tensor(contexts[i])
            last = torch.tensor([len(contexts[i]) - 1 for i in rows])
            logits = model(ids.to(device), logits_at=(torch.arange(len(rows)), last.to(device)))
            logp = torch.log_softmax(logits.float(), dim=-1)
            per_label = torch.stack([torch.logsumexp(logp[:, ids_], dim=-1) for ids_ in labels], dim=-1)
            total = torch.logsumexp(per_label, dim=-1, keepdim=True)
            for r, i in enumerate(rows):
                probs[i] = torch.exp(per_label[r] - total[r]).tolist()
                mass[i] = float(torch.exp(total[r, 0]))
    return probs, mass


def order_verdict(probs: list[float], a_first: bool) -> str:
    """One order's verdict about the replies: its likeliest label, label A meaning reply a when
    a was shown first."""
    label = max(range(len(probs)), key=lambda k: probs[k])
    if label == 2:
        return "tie"
    return ("a", "b")[label] if a_first else ("b", "a")[label]


def combine_orders(first: list[float], second: list[float], combine: str = "agree") -> tuple[str, float, float, float]:
    """(choice, p_a, p_b, p_tie) from the label probabilities of both orders (`first`: a shown as
    reply A; `second`: a shown as reply B)."""
    p_a = (first[0] + second[1]) / 2
    p_b = (first[1] + second[0]) / 2
    p_tie = (first[2] + second[2]) / 2 if len(first) > 2 else 0.0
    if combine == "mean":
        choice = max((("a", p_a), ("b", p_b), ("tie", p_tie)), key=lambda kv: kv[1])[0]
    else:
        v1, v2 = order_verdict(first, True), order_verdict(second, False)
        choice = v1 if v1 == v2 else "tie"
    return choice, p_a, p_b, p_tie


def judge_pairs(model, tokenizer, pairs, cfg: ModelJudgeConfig | None = None, **options) -> list[PairVerdict]:
    """The judge's verdict on each (prompt, reply_a, reply_b) of `pairs`, in their order.

    `model` and `tokenizer` as `llmkit.load` returns them (the model on the device it should run
    on, in eval mode); a prompt is a string or a list of chat messages (its last user turn is
    judged). `cfg` (or ModelJudgeConfig's fields as `options`: ties, combine, language, chat,
    max_reply_chars, batch_size, decode: a DecodeConfig, the weights its CPU products multiply by) sets
    how it asks; `device` and `rater` are the command's and unused here. Each pair costs two forward passes of its rubric (both orders), no generation.
    Deterministic: the same model, pairs and settings give the same verdicts."""
    if cfg is None:
        cfg = ModelJudgeConfig(**options)
    elif options:
        raise ConfigError("judge_pairs takes a ModelJudgeConfig or its fields as keywords, not both")

    chat = uses_chat_template(model, GenerateConfig(chat=cfg.chat))
    labels = label_ids(tokenizer, LABELS if cfg.ties else LABELS[:2])
    room = model.config.max_seq_len
    contexts, langs, truncated = [], [], []
    for prompt, a, b in pairs:
        text = prompt_text(prompt)
        lang = rubric_language(text, cfg.language)
        langs.append(lang)
        cut = False
        for first, second in ((a, b), (b, a)):
            ids = rubric_ids(tokenizer, rubric(text, first, second, lang, cfg.ties, cfg.max_reply_chars), lang, chat)
            cut |= len(ids) > room
            contexts.append(ids[-room:])  # the question stays: it is at the end
        truncated.append(cut)
    with decoding_weights(model, cfg.decode.weights):  # converted once per process, kept on the layers
        probs, mass = label_probabilities(model, tokenizer, contexts, labels, cfg.batch_size)
    out = []
    for n, lang in enumerate(langs):
        first, second = probs[2 * n], probs[2 * n + 1]
        choice, p_a, p_b, p_tie = combine_orders(first, second, cfg.combine)
        out.append(PairVerdict(choice, round(p_a, 6), round(p_b, 6), round(p_tie, 6),
                               (order_verdict(first, True), order_verdict(second, False)),
                               (tuple(round(p, 6) for p in first), tuple(round(p, 6) for p in second)),
                               round((mass[2 * n] + mass[2 * n + 1]) / 2, 6), lang, truncated[n]))
    return out
