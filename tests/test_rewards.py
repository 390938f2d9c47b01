import pytest

from llmkit.rewards import exact_match, normalize_answer, verify_rewards


def test_normalize_answer_trims_and_collapses_whitespace():
    assert normalize_answer("  4\t2 \n") == "4 2"
    assert normalize_answer("汉字\u3000 字") == "汉字 字"  # ideographic space is whitespace too


def test_exact_match_ignores_whitespace_differences_only():
    assert exact_match(" 57\n", "57")
    assert exact_match("olleh  dlrow", "olleh dlrow")
    assert not exact_match("olleh dlrow", "ollehdlrow")  # a space inside the answer is content
    assert not exact_match("57.", "57")
    assert not exact_match("", "57")


def test_verify_rewards_scores_each_pair():
    assert verify_rewards(["57", "5 7", "字文"], ["57", "57", "字文 "]) == [1.0, 0.0, 1.0]


def test_verify_rewards_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="2 responses but 1 answers"):
        verify_rewards(["a", "b"], ["a"])
