"""The model judge: verdicts read from label probabilities in both orders, ties, the rubric's
language, and `llmkit judge --model` writing them into a session's journal like a rater."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from llmkit.judge.agreement import judge_summary
from llmkit.judge.journal import JOURNAL_FILE, first_judgements, read_journal
from llmkit.judge.model_judge import combine_orders, judge_pairs, label_ids
from llmkit.judge.ranking import judged_by
from llmkit.judge.session import read_items
from tests.judge.conftest import arithmetic_prompts, known_replies, write_session
from tests.judge.test_export import judge_all, llmkit, right_answer
from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run

pytestmark = pytest.mark.usefixtures("one_thread")

REPLIES = re.compile(r"(?:\[Reply A\]|【回答 A】)\n(.*?)\n\n(?:\[Reply B\]|【回答 B】)\n(.*?)\n\n", re.S)


class CharTokenizer:
    """One id per character (its code point): " A" starts with the space's id, which every
    label shares, so only the letters' own ids count."""

    pad_id = 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def document_start_ids(self) -> list[int]:
        return [1]


class ScriptedJudge(torch.nn.Module):
    """A judge whose label logits `script(reply_a, reply_b, rubric)` gives: (A, B, C)."""

    def __init__(self, script):
        super().__init__()
        self.script = script
        self.config = SimpleNamespace(max_seq_len=4096)
        self.trained_on_chats = False
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # a device to run on
        self.seen: list[str] = []

    def forward(self, ids, logits_at):
        rows, last = logits_at
        out = torch.full((len(rows), 65536), -30.0)
        for r, (row, end) in enumerate(zip(rows.tolist(), last.tolist())):
            text = "".join(map(chr, ids[row, :end + 1].tolist()))
            self.seen.append(text)
            a, b = REPLIES.search(text).groups()
            out[r, [ord("A"), ord("B"), ord("C")]] = torch.tensor(self.script(a, b, text), dtype=torch.float)
        return out


def prefers(word):
    """A consistent judge: the reply containing `word` is much likelier, wherever it stands."""
    return lambda a, b, _: (4.0, 0.0, 0.0) if word in a else (0.0, 4.0, 0.0) if word in b else (0.0, 0.0, 4.0)


PAIRS = [("Q1", "right", "wrong"), ("Q2", "wrong", "right"), ("Q3", "meh", "meh")]


def test_a_consistent_judge_picks_the_better_reply_in_both_orders():
    verdicts = judge_pairs(ScriptedJudge(prefers("right")), CharTokenizer(), PAIRS)
    assert [v.choice for v in verdicts] == ["a", "b", "tie"]
    assert [v.orders for v in verdicts] == [("a", "a"), ("b", "b"), ("tie", "tie")]
    assert not any(v.flipped for v in verdicts)
    first = verdicts[0]
    # label A's probability renormalised over A, B, C with logits 4, 0, 0
    assert first.p_a == pytest.approx(torch.softmax(torch.tensor([4.0, 0, 0]), 0)[0].item(), abs=1e-6)
    assert first.p_a + first.p_b + first.p_tie == pytest.approx(1, abs=1e-5)


def test_a_judge_that_picks_a_position_flips_with_the_order_and_gives_a_tie():
    always_a = ScriptedJudge(lambda a, b, _: (3.0, 0.0, 0.0))
    verdicts = judge_pairs(always_a, CharTokenizer(), PAIRS)
    assert [v.orders for v in verdicts] == [("a", "b")] * 3
    assert all(v.flipped and v.choice == "tie" for v in verdicts)
    assert all(v.p_a == pytest.approx(v.p_b) for v in verdicts)  # the bias cancels in the mean


def test_mean_combination_keeps_a_preference_under_a_position_bias():
    # planted per-order probabilities: A favoured by 0.3 in both orders, the first reply by 0.1 more
    first, second = [0.8, 0.2], [0.6, 0.4]  # a shown as A: 0.8; a shown as B: 0.4
    assert combine_orders(first, second, "agree") == ("tie", pytest.approx(0.6), pytest.approx(0.4), 0.0)
    assert combine_orders(first, second, "mean")[0] == "a"
    assert combine_orders([0.2, 0.3, 0.5], [0.3, 0.2, 0.5], "mean") == ("tie", pytest.approx(0.2), pytest.approx(0.3), 0.5)


def test_without_ties_only_a_and_b_are_offered():
    says_c = ScriptedJudge(lambda a, b, _: (0.0, 1.0, 9.0))  # C is no label when ties are off
    verdicts = judge_pairs(says_c, CharTokenizer(), PAIRS[:1], ties=False)
    assert verdicts[0].p_tie == 0 and len(verdicts[0].probs[0]) == 2
    assert verdicts[0].orders == ("b", "a") and verdicts[0].choice == "tie"
    assert "C if they are equally good" not in says_c.seen[0]


def test_the_rubric_follows_the_prompts_language():
    judge = ScriptedJudge(prefers("x h p"))
    verdicts = judge_pairs(judge, CharTokenizer(), [("反转：p h x", "p h x", "x h p"), ("Reverse: p h x", "x h p", "p h x")])
    assert [v.lang for v in verdicts] == ["zh", "en"]
    assert [v.choice for v in verdicts] == ["b", "a"]
    zh = [t for t in judge.seen if "反转" in t]
    assert len(zh) == 2 and all("【请求】" in t and t.endswith("答案：") for t in zh)
    assert all("[Request]" in t and t.endswith("Answer:") for t in judge.seen if "Reverse" in t)
    # a chat prompt is judged by its last user turn
    chat = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "Reverse: a b"}]
    assert judge_pairs(judge, CharTokenizer(), [(chat, "b a", "a b")], language="zh")[0].lang == "zh"
    assert "Reverse: a b" in judge.seen[-1] and "first" not in judge.seen[-1]


def test_label_ids_leave_out_the_ids_labels_share():
    assert label_ids(CharTokenizer()) == [[ord("A")], [ord("B")], [ord("C")]]


def test_a_tiny_model_judges_the_same_in_any_batch(tok):
    """Right-padding in a batch changes nothing: each row is read at its own last token."""
    model = tiny_model(tok.vocab_size, max_seq_len=512).eval()
    model.trained_on_chats = False
    pairs = [("What is 10+20?", "30", "40"), ("What is 11+22? Please show the sum", "33", "It is 43, I think"),
             ("反转：c x u", "u x c", "c x u")]
    one = judge_pairs(model, tok, pairs, batch_size=1)
    four = judge_pairs(model, tok, pairs, batch_size=4)
    for x, y in zip(one, four):
        assert [*x.probs[0], *x.probs[1]] == pytest.approx([*y.probs[0], *y.probs[1]], abs=1e-5)
        assert sum(x.probs[0]) == pytest.approx(1, abs=1e-4) and 0 < x.label_mass < 1
        assert not x.truncated
    short = tiny_model(tok.vocab_size, max_seq_len=64).eval()
    short.trained_on_chats = False
    assert judge_pairs(short, tok, pairs[:1])[0].truncated  # the rubric's start is cut, its question kept


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_the_judge_reads_its_verdicts_through_low_precision_weights(tok, kind, monkeypatch):
    from llmkit.model import cpu_kernels
    from llmkit.model import packed_linear
    from llmkit.model.decode_weights import CONVERTED, DecodeConfig

    if not cpu_kernels.low_precision_available(kind):
        pytest.skip(f"needs the {kind} kernels")
    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 1)  # the tiny model's matrices are below the real bar
    model = tiny_model(tok.vocab_size, max_seq_len=512).eval()
    model.trained_on_chats = False
    pairs = [("What is 10+20?", "30", "40"), ("反转：c x u", "u x c", "c x u")]
    fp32 = judge_pairs(model, tok, pairs)
    low = judge_pairs(model, tok, pairs, decode=DecodeConfig(kind))
    assert vars(model.lm_head).get(CONVERTED)  # its products went through the converted copy
    for x, y in zip(low, fp32):
        assert [*x.probs[0], *x.probs[1]] == pytest.approx([*y.probs[0], *y.probs[1]], abs=2e-3)


def test_judge_command_writes_the_journal_resumes_and_exports(tmp_path, tok):
    ws = tmp_path / "ws"
    session = write_session(ws, "sess", arithmetic_prompts(6), known_replies(6, ("good", "bad")))
    judge_all(session, "checker", right_answer)
    write_checkpoint_run(ws, "judgebot", tiny_model(tok.vocab_size, max_seq_len=512), tok)

    out = llmkit("judge", "--model", "judgebot", "--in", "sess", "-w", ws)
    items = read_items(session)
    records, _ = first_judgements(read_journal(session / JOURNAL_FILE))
    mine = [r for r in records if r["rater"] == "model:judgebot"]
    assert sorted(r["item"] for r in mine) == sorted(i["id"] for i in items)
    for r in mine:
        mj = r["model_judge"]
        assert r["choice"] in ("left", "right", "tie") and mj["model"] == "judgebot"
        assert mj["orders"][0] in ("left", "right", "tie") and len(mj["probs"]) == 2
        assert r["choice"] == (mj["orders"][0] if mj["orders"][0] == mj["orders"][1] else "tie")
    assert "| model:judgebot | 6 |" in out and "| checker | 6 |" in out  # agreement with the human

    again = llmkit("judge", "--model", "judgebot", "--in", "sess", "-w", ws)
    assert len(read_journal(session / JOURNAL_FILE)) == 12 and "| model:judgebot | 6 |" in again

    llmkit("judge", "--export", "--in", "sess", "--out", "prefs", "--set", "resamples=10", "-w", ws)
    import json

    summary = json.loads((ws / "prefs" / "ranking.json").read_text())
    assert summary["judgements"] == 12 and summary["model_judges"]["judges"][0]["rater"] == "model:judgebot"
    assert "Human and model judges" in (ws / "prefs" / "summary.md").read_text()
    llmkit("judge", "--export", "--in", "sess", "--out", "prefs_model", "--set", "raters=model:judgebot",
           "--set", "resamples=10", "-w", ws)
    model_only = json.loads((ws / "prefs_model" / "ranking.json").read_text())
    assert model_only["judgements"] == 6 and model_only["model_judges"]["humans"] == []
    assert (judged_by(summary), judged_by(model_only)) == ("human and model", "model")  # report's titles
    assert judge_summary(records)["judges"][0]["vs"][0]["items"] == 6
