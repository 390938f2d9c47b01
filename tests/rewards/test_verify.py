"""Verifiable rewards (llmkit.rewards.verify): exact match up to whitespace, partial credit."""
import pytest

from llmkit.rewards.verify import answer_similarity, edit_distance, exact_match, normalize_answer, verify_rewards


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


def test_edit_distance_counts_insertions_deletions_and_substitutions():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3 and edit_distance("abc", "") == 3
    assert edit_distance("c b a", "c b a") == 0
    assert edit_distance("字文", "文字") == 2


def test_answer_similarity_gives_partial_credit_on_the_normalised_forms():
    assert answer_similarity(" c  b a ", "c b a") == 1.0  # exact match up to whitespace
    assert answer_similarity("c b x", "c b a") == pytest.approx(1 - 1 / 5)
    assert answer_similarity("c b", "c b a") == pytest.approx(1 - 2 / 5)
    assert answer_similarity("", "c b a") == 0.0
    assert answer_similarity("", "  ") == 1.0


def test_verify_rewards_with_partial_credit():
    assert verify_rewards(["c b a", "c b x", "zzzzz"], ["c b a"] * 3, partial=True) == \
        pytest.approx([1.0, 0.8, 0.0])
