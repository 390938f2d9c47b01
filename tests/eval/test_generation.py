import pytest
import sacrebleu
import torch
from rouge_score import rouge_scorer

from llmkit.errors import UserError
from llmkit.eval.generation import (ChineseTokenizer, GenerationConfig, bleu, contains_rate,
                                    evaluate_generation, exact_match_rate, language_of, prompt_ids,
                                    references_of, rouge)
from tests.train.posttrain_fixtures import constant_model

EN_HYP = "the cat sat on the mat today"
EN_REF = "the cat sat on a mat today"
ZH_HYP = "床前明月光，疑是地上霜。"
ZH_REF = "床前明月光，疑似地上霜。"


def test_english_bleu_and_rouge_are_the_libraries_numbers():
    assert bleu([EN_HYP], [[EN_REF]], chinese=False) == pytest.approx(
        sacrebleu.corpus_bleu([EN_HYP], [[EN_REF]]).score)
    want = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"]).score(EN_REF, EN_HYP)
    got = rouge([EN_HYP], [[EN_REF]], chinese=False)
    assert got == pytest.approx({k: 100 * v.fmeasure for k, v in want.items()})


def test_chinese_bleu_counts_characters():
    spaced = sacrebleu.corpus_bleu([" ".join(ZH_HYP)], [[" ".join(ZH_REF)]], tokenize="none").score
    assert bleu([ZH_HYP], [[ZH_REF]], chinese=True) == pytest.approx(spaced)
    assert bleu([ZH_HYP], [[ZH_REF]], chinese=True) == pytest.approx(
        sacrebleu.corpus_bleu([ZH_HYP], [[ZH_REF]], tokenize="zh").score)


def test_chinese_rouge_counts_characters_without_punctuation():
    # 10 Han characters each, 9 shared (是/似); of 9 bigrams each, the 2 around 是/似 differ
    got = rouge([ZH_HYP], [[ZH_REF]], chinese=True)
    assert got["rouge1"] == pytest.approx(90.0)
    assert got["rouge2"] == pytest.approx(100 * 7 / 9)
    assert got["rougeL"] == pytest.approx(90.0)
    # rouge-score alone sees no tokens in Chinese text at all
    assert rouge_scorer.RougeScorer(["rouge1"]).score(ZH_REF, ZH_HYP)["rouge1"].fmeasure == 0.0


def test_chinese_tokenizers():
    assert ChineseTokenizer("char").tokenize("我爱Python 3！") == ["我", "爱", "python", "3"]
    assert ChineseTokenizer("jieba").tokenize("我们喜欢自然语言处理。") == ["我们", "喜欢", "自然语言", "处理"]


def test_best_reference_counts_and_a_repeated_reference_changes_nothing():
    assert rouge([EN_HYP], [["a dog", EN_HYP]], chinese=False)["rouge1"] == pytest.approx(100.0)
    assert bleu([EN_HYP, "a b c d e"], [[EN_REF], ["a b c d e", "x"]], chinese=False) == pytest.approx(
        bleu([EN_HYP, "a b c d e"], [[EN_REF, EN_REF], ["a b c d e", "x"]], chinese=False))


def test_references_language_and_exact_match():
    assert references_of({"references": ["a", "b"]}, "r") == ["a", "b"]
    assert references_of({"answer": "42", "response": "x"}, "r") == ["42"]
    assert references_of({"messages": [{"role": "user", "content": "q"},
                                       {"role": "assistant", "content": "a"}]}, "r") == ["a"]
    with pytest.raises(UserError, match="row 7"):
        references_of({"prompt": "q"}, "row 7")
    assert language_of({}, ["疑是地上霜"]) == "zh" and language_of({"lang": "en"}, ["疑是"]) == "en"
    assert exact_match_rate([" 42 ", "41"], [["42"], ["40", "41"]]) == 1.0


def test_contains_finds_the_answer_in_a_sentence_as_a_whole_word():
    assert contains_rate(["The capital of Japan is Tokyo.", "A week has SEVEN days", "中国的首都是北京。",
                          "forty\ntwo", "It is H2O."],
                         [["tokyo"], ["7", "seven"], ["北京"], ["forty two"], ["h2o"]]) == 1.0
    # a number inside a longer number, or a word inside a longer word, is not the answer
    assert contains_rate(["17 days", "Romeo", "100 degrees", "JAPAN"],
                         [["7"], ["Rome"], ["0", "zero"], ["Tokyo"]]) == 0.0
    assert contains_rate(["Paris", "Lyon"], [["paris"], ["Paris"]]) == 0.5


def test_chat_and_plain_prompts(tok):
    row = {"prompt": "What is 2+3?"}
    assert prompt_ids(tok, row, True, "r") == tok.encode_chat(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True)[0]
    assert prompt_ids(tok, row, False, "r") == [tok.eos_id, *tok.encode("What is 2+3?")]


def test_evaluate_generation_reports_each_language_and_keeps_samples(tok):
    rows = [{"prompt": "What is 2+3?", "reference": "5"}, {"prompt": "计算 2+3", "reference": "五"}]
    metrics, samples = evaluate_generation(constant_model(tok.vocab_size), tok, rows,
                                           GenerationConfig(max_new_tokens=3), chat=False,
                                           device=torch.device("cpu"))
    assert set(metrics) == {"en", "zh"}
    assert set(metrics["en"]) == {"bleu", "rouge1", "rouge2", "rougeL", "exact_match", "contains",
                                  "examples"}
    assert [s["lang"] for s in samples] == ["en", "zh"] and samples[0]["references"] == ["5"]


def test_a_reply_cut_at_the_token_limit_inside_a_character_is_scored_without_it(tok, monkeypatch):
    import llmkit.model.decoding

    ids = tok.encode("等于龘")  # 龘 is not in the vocabulary: three byte tokens
    assert [tok.id_to_piece(i) for i in ids[-3:]] == ["<0xE9>", "<0xBE>", "<0x98>"]
    replies = {len(ids) - 1: ids[:-1], len(ids): ids}  # max_new_tokens -> the reply it allows
    monkeypatch.setattr(llmkit.model.decoding, "generate_replies",
                        lambda model, prompts, max_new_tokens, **kw: [replies[max_new_tokens]] * len(prompts))
    rows = [{"prompt": "计算", "reference": "等于龘"}]
    for limit, reply in ((len(ids) - 1, "等于"), (len(ids), "等于龘")):
        _, [sample] = evaluate_generation(constant_model(tok.vocab_size), tok, rows,
                                          GenerationConfig(max_new_tokens=limit), chat=False,
                                          device=torch.device("cpu"))
        assert sample["reply"] == reply
