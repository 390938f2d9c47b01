import threading
import time

import pytest

from llmkit.errors import ConfigError
from llmkit.rewards import math as math_rewards
from llmkit.rewards.math import answers_equal, looks_pathological, math_reward, to_english
from tests.rewards.math_pairs import answer_pairs

math_verify = pytest.importorskip("math_verify")


def test_agrees_with_math_verify_on_generated_pairs():
    """The bench's 500 pairs in small: llmkit on the texts as generated (Chinese phrasing,
    full-width digits, bare LaTeX) equals math-verify on the same answers written as it documents."""
    pairs = answer_pairs(96, seed=7)
    assert {p.lang for p in pairs} == {"en", "zh"} and {p.equal for p in pairs} == {True, False}
    for p in pairs:
        reference = math_verify.verify(math_verify.parse(p.gold_canonical), math_verify.parse(p.predicted_canonical))
        assert answers_equal(p.gold, p.predicted) == reference == p.equal, p


@pytest.mark.parametrize("gold, predicted", [
    ("\\frac{3}{4}", "0.75"), ("3/4", "The answer is $\\boxed{\\dfrac{3}{4}}$."), ("50\\%", "\\frac12"),
    ("1234", "1,234"), ("12", "12 cm"), ("\\{1,2\\}", "\\{2, 1\\}"), ("[0,1)", "$x \\in [0, 1)$"),
    ("(1,2)", "(1, 2)"), ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}"), ("17/3", "The answer is 17/3."),
    ("12", "所以答案为12。"), ("3/4", "答案是３／４"), ("12", "答案：１２"), ("0.25", "百分之25"),
    ("12", "最终答案是$\\boxed{12}$"), ("-3", "－３"), ("5", "结果为5个"),
    ("7/9", "First, $2+3=5$ and 2*3 = 6. 7/9"), ("-38", "首先，29+88=117。－３８米"),
])
def test_equal_forms(gold, predicted):
    assert answers_equal(gold, predicted)


@pytest.mark.parametrize("gold, predicted", [
    ("\\frac{1}{3}", "0.33"), ("(1,2)", "(2,1)"), ("[0,1)", "(0,1]"), ("\\{1,2\\}", "\\{1,2,3\\}"),
    ("12", "答案是13"), ("12", "no answer here"), ("12", ""), ("x^2+1", "(x+1)^2"),
    ("5", "First, $2+3=5$. 7/9"),
])
def test_unequal_forms(gold, predicted):
    assert not answers_equal(gold, predicted)


def test_english_text_is_left_as_it_is_and_chinese_is_read_as_english():
    text = "The answer is $\\boxed{12}$."
    assert to_english(text) == text
    assert "final answer is 12" in to_english("所以答案为１２。")


def test_math_reward_reads_the_answer_or_solution_column_and_skips_unreadable_golds():
    completions = ["The answer is $\\boxed{4}$", [{"role": "assistant", "content": "答案是５"}], "I think 7", "4"]
    assert math_reward(["p"] * 4, completions, answer=["4", "5", "8", ""]) == [1.0, 1.0, 0.0, None]
    assert math_reward(["p"], ["\\boxed{1/2}"], solution=["0.5"], other=[1]) == [1.0]
    with pytest.raises(ConfigError, match="'answer' or 'solution'.*'other'"):
        math_reward(["p"], ["1"], other=["1"])


@pytest.mark.parametrize("text", ["2^{10^{10}}", "(10^{10})!", "x^{100000}", "99999**99999", "1000000!"])
def test_huge_numbers_are_refused_where_no_timeout_can_stop_sympy(text):
    assert looks_pathological(text)
    result = []
    worker = threading.Thread(target=lambda: result.append(answers_equal("1", f"${text}$")))
    start = time.monotonic()
    worker.start()
    worker.join(30)
    assert result == [False] and time.monotonic() - start < 5


@pytest.mark.parametrize("text", ["2^{10}", "10!", "x^2+2x+1", "1,234,567", "(1,2)"])
def test_ordinary_answers_are_not_refused(text):
    assert not looks_pathological(text)


def test_the_main_thread_times_sympy_out(monkeypatch):
    monkeypatch.setattr(math_rewards, "TIMEOUT_S", 1)
    start = time.monotonic()
    assert not answers_equal("1", "$9^{9^{9}}$")
    assert time.monotonic() - start < 10
