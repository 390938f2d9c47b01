"""Each kind of synth turns replies into kept and removed rows for the stated reasons, with a
scripted generator and scripted judges (no model): the mechanism, apart from any model's skill."""

import random
import re

import pytest

from llmkit.synth import kinds
from llmkit.synth.config import SynthConfig
from llmkit.synth.prompts import parse_qa, yes_no
from llmkit.synth.requests import Completion, Raw


class Scripted:
    """A generator whose reply to a prompt is `reply(prompt_text, index)`; records what it was asked."""

    def __init__(self, reply, stopped=True, special=False):
        self.reply, self.stopped, self.special = reply, stopped, special
        self.asked, self.tokens = [], 0

    def complete(self, prompts, sampling, seed):
        self.asked += prompts
        return [Completion(self.reply(p if isinstance(p, Raw) else p[-1]["content"], i),
                           5, self.stopped(i) if callable(self.stopped) else self.stopped,
                           self.special(i) if callable(self.special) else self.special)
                for i, p in enumerate(prompts)]

    def user_turn_prefix(self):
        return Raw((1, 2), "<|user|>")


def test_magpie_keeps_one_user_turn_and_counts_the_rest_by_reason():
    replies = ["How do I sort a list?", "  ", "Cut off mid", "Hi<|assistant|>", "Name three rivers."]
    gen = Scripted(lambda p, i: replies[i], stopped=lambda i: i != 2, special=lambda i: i == 3)
    kept, removed = kinds.instructions(10, 5, gen, SynthConfig(kind="instructions"), 0, "synth:m")
    assert gen.asked == [Raw((1, 2), "<|user|>")] * 5  # the template's user-turn prefix only
    assert [(r["id"], r["prompt"]) for r in kept] == [("instruction-0000010", "How do I sort a list?"),
                                                      ("instruction-0000014", "Name three rivers.")]
    assert [r["reason"] for r in removed] == ["empty_instruction", "no_end_of_turn", "more_than_one_turn"]


class Recording(Scripted):
    def complete(self, prompts, sampling, seed):
        self.sampling = sampling
        return super().complete(prompts, sampling, seed)


@pytest.mark.parametrize("kind, settings, sampled", [
    ("instructions", {}, (1.0, 0.9)),  # Magpie's temperature, the tail cut (config.SAMPLING)
    ("instructions", {"top_p": 1.0, "temperature": 0.8}, (0.8, 1.0)),  # set: as set
    ("answers", {}, (0.7, 1.0)),
])
def test_each_kind_samples_at_its_defaults_unless_set(kind, settings, sampled):
    cfg = SynthConfig(kind=kind, **settings)
    assert (cfg.temperature, cfg.top_p) == sampled  # resolved: the manifest records what was used
    gen = Recording(lambda p, i: "Name three rivers.")
    if kind == "instructions":
        kinds.instructions(0, 2, gen, cfg, 0, "s")
    else:
        kinds.answers([{"id": "a", "prompt": "p", "text": "p"}], gen, cfg, 0, "s")
    assert (gen.sampling.temperature, gen.sampling.top_p) == sampled


def test_answers_n_samples_per_prompt_with_turns_and_carried_columns():
    rows = [{"id": "a", "prompt": "What is 2+2?", "text": "x", "answer": "4"},
            {"id": "b", "messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Name a colour."}], "text": "y"}]
    gen = Scripted(lambda p, i: f"reply {i} to {p}")
    kept, removed = kinds.answers(rows, gen, SynthConfig(kind="answers", n=2), 0, "synth:m")
    assert removed == [] and [r["id"] for r in kept] == ["a-0", "a-1", "b-0", "b-1"]
    assert kept[0]["answer"] == "4" and kept[0]["response"] == "reply 0 to What is 2+2?"
    assert kept[3]["messages"] == [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Name a colour."},
                                   {"role": "assistant", "content": "reply 3 to Name a colour."}]


def test_answers_cut_at_the_token_limit_are_removed_unless_kept():
    rows = [{"id": "a", "prompt": "p", "text": "p"}]
    gen = Scripted(lambda p, i: "half an ans", stopped=False)
    assert [r["reason"] for r in kinds.answers(rows, gen, SynthConfig(kind="answers"), 0, "s")[1]] == \
        ["cut_at_max_new_tokens"]
    kept, _ = kinds.answers(rows, gen, SynthConfig(kind="answers", keep_truncated=True), 0, "s")
    assert kept[0]["response"] == "half an ans"


NAMES = ["Zorvania", "Kelbria", "Ostmark", "Varnholt", "Quillon"]


def planted_documents(n: int = 50, seed: int = 0) -> list[dict]:
    """Documents each stating one fact (a country's capital) a supported answer repeats."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        capital = "".join(rng.choice("bcdfgklmnprstv") + rng.choice("aeiou") for _ in range(3)).title()
        docs.append({"id": f"d{i}", "capital": capital, "lang": "en",
                     "text": f"{NAMES[i % 5]}-{i} is a small country. Its capital is {capital}, a port city."})
    return docs


class ScriptedGrounding:
    """A judge that finds an answer supported when the document states it (a literal check)."""

    def yes_probability(self, prompts):
        out = []
        for p in prompts:
            text = p[-1]["content"]
            answer = re.search(r"Proposed answer: (.+)\n", text).group(1)
            out.append(1.0 if answer in text.split("\n\nQuestion:")[0] else 0.0)
        return out


def test_the_grounding_check_rejects_planted_unsupported_answers_and_keeps_supported_ones():
    docs = planted_documents()
    wrong = {d["id"] for d in docs[::2]}  # every other document gets an answer it does not state

    def reply(prompt, i):
        doc = docs[i]
        answer = "Atlantis" if doc["id"] in wrong else doc["capital"]
        return f"Question: What is the capital of {NAMES[i % 5]}-{i}?\nAnswer: {answer}"

    kept, removed = kinds.qa(docs, Scripted(reply), ScriptedGrounding(), SynthConfig(kind="qa"), 0, "s")
    rejected = {r["document_id"] for r in removed if r["reason"] == "unsupported_answer"}
    assert len(rejected & wrong) / len(wrong) >= 0.9 and rejected <= wrong
    assert {r["document_id"] for r in kept} == {d["id"] for d in docs} - wrong
    assert kept[0]["prompt"].startswith("What is the capital") and kept[0]["support"] == 1.0


def test_qa_replies_without_the_form_are_removed_before_the_judge():
    docs = planted_documents(3)
    gen = Scripted(lambda p, i: ["Just some text.", "Question: Why?", "Question: Q\nAnswer: A"][i])
    judge = ScriptedGrounding()
    kept, removed = kinds.qa(docs, gen, judge, SynthConfig(kind="qa"), 0, "s")
    assert [r["reason"] for r in removed] == ["no_question", "no_answer", "unsupported_answer"]


def test_qa_and_rephrase_ask_in_chinese_for_chinese_rows():
    rows = [{"id": "z", "text": "长江是中国最长的河流。", "lang": "zh"}, {"id": "e", "text": "The Nile.", "lang": "en"}]
    gen = Scripted(lambda p, i: f"rewrite {i}")
    kept, _ = kinds.rephrase(rows, gen, SynthConfig(kind="rephrase", styles=["wikipedia", "simple"]), 0, "s")
    assert [r["id"] for r in kept] == ["z-wikipedia", "z-simple", "e-wikipedia", "e-simple"]
    assert "维基百科" in gen.asked[0][-1]["content"] and "长江" in gen.asked[0][-1]["content"]
    assert "Wikipedia" in gen.asked[2][-1]["content"] and kept[0]["style"] == "wikipedia"
    assert kept[0]["lang"] == "zh"  # carried


class ScriptedPairs:
    def __init__(self, margins):
        self.margins_ = margins

    def margins(self, prompts, first, second):
        return [self.margins_[f] for f in first]


def test_pairs_put_the_judges_choice_first_and_remove_ties_and_identical_replies():
    rows = [{"id": f"p{i}", "prompt": f"q{i}", "text": f"q{i}"} for i in range(4)]
    replies = ["good0", "bad0", "bad1", "good1", "same", "same", "tie_a", "tie_b"]
    judge = ScriptedPairs({"good0": 0.8, "bad1": -0.5, "tie_a": 0.0})
    kept, removed = kinds.pairs(rows, Scripted(lambda p, i: replies[i]), judge,
                                SynthConfig(kind="pairs"), 0, "s")
    assert [(r["prompt"], r["chosen"], r["rejected"], r["margin"]) for r in kept] == [
        ("q0", "good0", "bad0", 0.8), ("q1", "good1", "bad1", 0.5)]
    assert [(r["id"], r["reason"]) for r in removed] == [("p2", "identical_replies"), ("p3", "tie")]


@pytest.mark.parametrize("reply, parsed", [
    ("Question: Who?\nAnswer: Bob.", ("Who?", "Bob.")),
    ("**Question:** Who?\n**Answer:** Bob", ("Who?", "Bob")),
    ("问题：谁？\n答案：小明", ("谁？", "小明")),
    ("Answer: Bob\nQuestion: Who?", "no_answer"),
])
def test_parse_qa(reply, parsed):
    assert parse_qa(reply) == parsed


def test_a_written_verdict():
    assert [yes_no(t) for t in ("Yes, it is.", " no", "是的", "否", "Maybe")] == [True, False, True, False, None]


class ScriptedLikelihood:
    """Log-likelihoods as a model that copies gives them: high when the prompt states the answer."""

    def answer_logprobs(self, prompts, answers):
        return [-0.2 if a in p[-1]["content"] else -3.0 for p, a in zip(prompts, answers)]


def test_likelihood_grounding_keeps_answers_the_document_makes_likelier():
    docs = planted_documents(10)

    def reply(prompt, i):
        return f"Question: What is the capital?\nAnswer: {'Atlantis' if i % 2 else docs[i]['capital']}"

    kept, removed = kinds.qa(docs, Scripted(reply), ScriptedLikelihood(),
                             SynthConfig(kind="qa", grounding="likelihood"), 0, "s")
    assert [r["document_id"] for r in kept] == [f"d{i}" for i in range(0, 10, 2)]
    assert kept[0]["support"] == 2.8 and {r["reason"] for r in removed} == {"unsupported_answer"}
