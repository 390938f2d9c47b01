from pathlib import Path

import numpy as np
import pytest
import torch

from llmkit.errors import ConfigError, UserError
from llmkit.eval.choice import (ChoiceConfig, choice_scores, context, continuation,
                                continuation_requests, evaluate_choice, split_first_shots)
from llmkit.data.input_files import Question, eval_input, parse_question, parse_questions, read_rows
from llmkit.model.lm_scoring import LMScorer
from tests.eval.conftest import UnigramLM

EVAL_DATA = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "data" / "eval"


def test_mmlu_and_ceval_rows_parse_to_the_same_question():
    mmlu = {"question": "2+2?", "choices": ["3", "4", "5", "6"], "answer": 1, "subject": "math"}
    ceval = {"id": 0, "question": "2+2?", "A": "3", "B": "4", "C": "5", "D": "6", "answer": "B",
             "subject": "math"}
    assert parse_question(mmlu, "m") == parse_question(ceval, "c") == Question(
        "2+2?", ["3", "4", "5", "6"], 1, "math")


@pytest.mark.parametrize("row,what", [
    ({"question": "q", "choices": ["a", "b"], "answer": "C"}, "answer"),
    ({"question": "q", "choices": ["a", "b"], "answer": 2}, "answer"),
    ({"question": "q", "A": "a", "answer": "A"}, "two choices"),
    ({"choices": ["a", "b"], "answer": "A"}, "question"),
])
def test_a_malformed_question_names_its_row(row, what):
    with pytest.raises(UserError, match=f"qs.jsonl row 3.*{what}"):
        parse_questions([{"question": "ok", "choices": ["a", "b"], "answer": "A"}] * 2 + [row], "qs.jsonl")


def test_prompts_in_english_and_chinese():
    en = Question("Which is even?", ["3", "4"], 1, "high_school_math")
    zh = Question("哪个是偶数？", ["三", "四"], 1, "数学")
    assert context(en, [], "text") + continuation(en, 1, "text") == "Question: Which is even?\nAnswer: 4"
    assert context(zh, [], "text") + continuation(zh, 1, "text") == "问题：哪个是偶数？\n答案：四"
    assert context(en, [], "letter") == (
        "The following are multiple choice questions (with answers) about high school math.\n\n"
        "Which is even?\nA. 3\nB. 4\nAnswer:")
    assert continuation(en, 1, "letter") == " B" and continuation(zh, 1, "letter") == "B"
    shot = Question("Which is odd?", ["3", "4"], 0, "high_school_math")
    assert context(en, [shot], "text") == (
        "Question: Which is odd?\nAnswer: 3\n\nQuestion: Which is even?\nAnswer:")


def test_first_shots_of_each_subject_become_the_pool():
    qs = [Question(f"q{i}", ["a", "b"], 0, s) for i, s in enumerate("xxyxy")]
    scored, pool = split_first_shots(qs, 1)
    assert [q.question for q in pool] == ["q0", "q2"]
    assert [q.question for q in scored] == ["q1", "q3", "q4"]


def favouring(tok, texts: list[str], size: int) -> UnigramLM:
    """A model that gives the tokens of `texts` high probability and every other token little."""
    logits = torch.zeros(size)
    for t in texts:
        logits[tok.encode(t)] = 10.0
    return UnigramLM(logits)


QUESTIONS = [Question("What is 30+47?", ["77", "12", "30"], 0),
             Question("What is 3+4?", ["45", "7", "31"], 1),
             Question("What is 70+7?", ["21", "50", "77"], 2)]


def test_the_choice_the_model_finds_likeliest_is_its_answer(tok):
    model = favouring(tok, [" 7"], tok.vocab_size)
    wrong = {t for q in QUESTIONS for i, c in enumerate(q.choices) if i != q.answer
             for t in tok.encode(c)}
    assert tok.encode("7")[0] not in wrong  # only the right choices have the favoured digit
    scorer = LMScorer(model, device="cpu")
    result = evaluate_choice(scorer, tok, QUESTIONS, ChoiceConfig())
    assert result["acc"] == 1.0 and result["acc_norm"] == 1.0 and result["questions"] == 3
    flipped = favouring(tok, [" 1", " 2", " 4", " 5", " 3"], tok.vocab_size)
    assert evaluate_choice(LMScorer(flipped, device="cpu"), tok, QUESTIONS, ChoiceConfig())["acc"] == 0.0


def test_only_the_continuation_tokens_are_scored(tok):
    model = favouring(tok, [" 7"], tok.vocab_size)
    scores = choice_scores(LMScorer(model, device="cpu"), tok, QUESTIONS[:1], [], 0, "text")
    requests = continuation_requests(tok, "Question: What is 30+47?\nAnswer:", [" 77", " 12", " 30"], 256)
    for score, (ids, n) in zip(scores[0], requests):
        assert ids[0] == tok.eos_id and tok.decode(ids[-n:]) in (" 77", " 12", " 30")
        assert score == pytest.approx(sum(model.logprob(t) for t in ids[-n:]), rel=1e-6)


def test_letter_format_scores_the_letter(tok):
    model = favouring(tok, ["B"], tok.vocab_size)  # " B" is a space then "B" here
    result = evaluate_choice(LMScorer(model, device="cpu"), tok, QUESTIONS,
                             ChoiceConfig(format="letter"))
    assert result["acc"] == pytest.approx(1 / 3)  # only the second question's answer is B


def test_first_k_shots_are_not_scored_and_subjects_are_reported(tok):
    qs = [Question(q.question, q.choices, q.answer, s) for q, s in zip(QUESTIONS * 2, "aabbab")]
    result = evaluate_choice(LMScorer(favouring(tok, [" 7"], tok.vocab_size), device="cpu"), tok,
                             qs, ChoiceConfig(shots=1))
    assert result["questions"] == 4 and result["shots"] == 1
    assert {s: r["questions"] for s, r in result["by_subject"].items()} == {"a": 2, "b": 2}


def test_dev_files_must_pair_with_files():
    with pytest.raises(ConfigError):
        ChoiceConfig(files=["a.jsonl", "b.jsonl"], dev_files=["a_dev.jsonl"])


def test_demo_question_files_parse_with_four_choices_and_balanced_answers(tmp_path):
    files = sorted(EVAL_DATA.glob("mmlu_*.jsonl")) + sorted(EVAL_DATA.glob("ceval_*.jsonl"))
    assert len(files) >= 4  # en + zh, test + dev
    for f in files:
        qs = parse_questions(read_rows(eval_input(None, str(f))), f.name)
        assert all(len(q.choices) == 4 for q in qs)
        if "dev" not in f.name:
            assert len(qs) >= 24
            counts = np.bincount([q.answer for q in qs], minlength=4)
            assert counts.min() >= len(qs) // 8  # no letter is a safe guess
