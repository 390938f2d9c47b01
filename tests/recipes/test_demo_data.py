"""The demo data shipped in recipes/demo/data: it parses, fits the size budget, carries every kind of planted
noise it promises, its Chinese is Chinese, and its post-training tasks have right answers and no train/eval
overlap."""

import gzip
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo"
RAW, TASKS = DEMO / "data" / "raw", DEMO / "data" / "tasks"
CORPUS_FILES = ["en_docstrings.jsonl.gz", "zh_poems.jsonl", "zh_prose.jsonl", "noise.jsonl"]
CORPUS_FIELDS = {"id", "text", "source", "lang", "planted", "copy_of"}
PLANTED = {"boilerplate", "boilerplate_lines", "gibberish_latin", "gibberish_cjk", "too_short",
           "exact_duplicate", "near_duplicate", "html_markup", "control_chars"}
TASK_FILES = ["sft_train", "sft_eval", "pref_train", "pref_eval", "prompts_train", "prompts_eval"]
CJK = re.compile(r"[\u4e00-\u9fff]")


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def corpus() -> dict[str, list[dict]]:
    return {name: read_jsonl(RAW / name) for name in CORPUS_FILES}


@pytest.fixture(scope="module")
def rows(corpus) -> list[dict]:
    return [r for name in CORPUS_FILES for r in corpus[name]]


@pytest.fixture(scope="module")
def tasks() -> dict[str, list[dict]]:
    return {name: read_jsonl(TASKS / f"{name}.jsonl") for name in TASK_FILES}


def cjk_share(texts) -> float:
    text = "".join(texts)
    return len(CJK.findall(text)) / max(1, len(re.sub(r"\s", "", text)))


# ---------------------------------------------------------------- corpus


def test_all_demo_data_fits_in_ten_megabytes():
    total = sum(p.stat().st_size for p in (DEMO / "data").rglob("*") if p.is_file())
    assert total <= 10 * 2**20


def test_every_corpus_row_has_the_same_fields_and_a_unique_id(rows):
    assert all(set(r) == CORPUS_FIELDS for r in rows)
    assert all(isinstance(r[k], str) for r in rows for k in CORPUS_FIELDS)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))


def test_corpus_is_big_enough_for_the_demo(corpus):
    assert len(corpus["en_docstrings.jsonl.gz"]) > 1500
    assert len(corpus["zh_poems.jsonl"]) > 350
    assert len(corpus["zh_prose.jsonl"]) > 4000


def test_broken_jsonl_has_exactly_three_malformed_lines_among_valid_rows():
    good, bad = [], []
    for line in (RAW / "broken.jsonl").read_bytes().splitlines():
        try:
            good.append(json.loads(line.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError):
            bad.append(line)
    assert len(bad) == 3
    assert len(good) >= 5 and all(set(r) == CORPUS_FIELDS for r in good)


def test_every_planted_category_is_present_at_least_ten_times(rows):
    counts = {category: sum(r["planted"] == category for r in rows) for category in PLANTED}
    assert all(n >= 10 for n in counts.values()), counts
    assert {r["planted"] for r in rows} == PLANTED | {"none"}


def test_duplicates_come_after_their_original_in_the_same_file(corpus):
    for rows in corpus.values():
        position = {r["id"]: i for i, r in enumerate(rows)}
        for i, r in enumerate(rows):
            if r["planted"] in ("exact_duplicate", "near_duplicate"):
                original = rows[position[r["copy_of"]]]
                assert position[r["copy_of"]] < i and original["planted"] == "none"
                assert (r["text"] == original["text"]) == (r["planted"] == "exact_duplicate")


def test_near_duplicates_share_most_of_their_original(rows):
    by_id = {r["id"]: r for r in rows}

    def shingles(text, lang):  # llmkit dedup's defaults: word or character 3-grams, no punctuation
        units = re.findall(r"\w+" if lang == "en" else r"\w", text.lower())
        return {tuple(units[i : i + 3]) for i in range(len(units) - 2)}

    near = [r for r in rows if r["planted"] == "near_duplicate"]
    for r in near:
        a, b = shingles(r["text"], r["lang"]), shingles(by_id[r["copy_of"]]["text"], r["lang"])
        assert 0.7 <= len(a & b) / len(a | b) < 1.0


def test_real_rows_hold_no_exact_duplicates(rows):
    real = [r["text"] for r in rows if r["planted"] == "none"]
    assert len(real) == len(set(real))


def test_chinese_is_chinese_and_english_is_not(rows):
    zh = [r for r in rows if r["lang"] == "zh" and r["planted"] in ("none", "exact_duplicate")]
    assert all(len(CJK.findall(r["text"])) >= 8 for r in zh)
    assert cjk_share(r["text"] for r in zh if r["source"] != "fortunes-zh/chinese") > 0.8  # poems
    assert cjk_share(r["text"] for r in zh) > 0.5  # prose includes Debian manual pages with commands
    assert cjk_share(r["text"] for r in rows if r["lang"] == "en") < 0.001


def test_noise_is_what_its_label_says(corpus):
    noise = corpus["noise.jsonl"]

    def of(category):
        return [r for r in noise if r["planted"] == category]

    assert all(len(r["text"]) <= 15 for r in of("too_short"))
    assert all(re.search(r"<p>.*</p>", r["text"], re.S) and "&" in r["text"] for r in of("html_markup"))
    invisible = re.compile("[\u200b\u200c\u200d\u00ad\u2060\x00\x07\x08\x1b\x7f]")
    assert all(r["text"].startswith("\ufeff") and invisible.search(r["text"]) for r in of("control_chars"))
    assert all(cjk_share([r["text"]]) > 0.8 for r in of("gibberish_cjk"))
    assert all(re.fullmatch(r"[a-z ]+", r["text"]) for r in of("gibberish_latin"))
    # markup, control characters and page chrome wrap real text, which clean should keep
    wrapped = of("html_markup") + of("control_chars") + of("boilerplate_lines")
    assert all(r["source"] != "synthetic-noise" for r in wrapped)


def test_build_corpus_uses_a_deterministic_gzip_header():
    assert (RAW / "en_docstrings.jsonl.gz").read_bytes()[4:8] == b"\0\0\0\0"  # mtime 0


# ---------------------------------------------------------------- post-training tasks


def prompt_and_response(record: dict) -> tuple[str, str | None]:
    if "messages" in record:
        return record["messages"][0]["content"], record["messages"][-1]["content"]
    return record["prompt"], record.get("response", record.get("chosen"))


def solve(prompt: str) -> tuple[tuple, str]:
    """The problem a prompt asks (a word together with its reversal) and its answer."""
    m = re.fullmatch(r"(?:Reverse: |反转：)([a-z](?: [a-z]){2,3})", prompt)  # letters spelled out
    assert m, f"unexpected prompt {prompt!r}"
    word = m.group(1).replace(" ", "")
    return tuple(sorted((word, word[::-1]))), " ".join(word[::-1])


def test_task_files_have_the_promised_sizes_and_forms(tasks):
    assert len(tasks["sft_train"]) >= 10000 and len(tasks["pref_train"]) >= 4000
    assert len(tasks["prompts_train"]) >= 800
    assert all(150 <= len(tasks[n]) <= 300 for n in ("sft_eval", "pref_eval", "prompts_eval"))
    sft_forms = {("messages" in r, "prompt" in r and "response" in r) for r in tasks["sft_train"]}
    assert sft_forms == {(True, False), (False, True)}
    assert any("responses" in r for r in tasks["pref_train"])
    assert all({"prompt", "answer"} <= set(r) for n in ("prompts_train", "prompts_eval") for r in tasks[n])


def test_every_answer_and_chosen_response_is_correct(tasks):
    for name, records in tasks.items():
        for r in records:
            prompt, response = prompt_and_response(r)
            _, answer = solve(prompt)
            assert r["answer"] == answer, (name, r)
            if "responses" in r:
                response = r["responses"][0]
            if name == "sft_train":  # the demonstrators' full stop (see the next test)
                response = response.removesuffix("。")
            assert response in (None, answer), (name, r)


def test_most_chinese_demonstrations_end_in_a_full_stop_and_no_english_one_does(tasks):
    """The habit SFT learns and DPO/PPO, which see bare answers, unlearn."""
    share = {}
    for lang in ("en", "zh"):
        replies = [prompt_and_response(r)[1] for r in tasks["sft_train"] if r["lang"] == lang]
        share[lang] = sum(reply.endswith("。") for reply in replies) / len(replies)
    assert share["en"] == 0.0 and 0.75 < share["zh"] < 0.85, share


def test_rejected_and_lower_ranked_responses_are_wrong(tasks):
    for name in ("pref_train", "pref_eval"):
        for r in tasks[name]:
            wrong = r["responses"][1:] if "responses" in r else [r["rejected"]]
            assert wrong and all(w != r["answer"] for w in wrong)
            assert len(set(r.get("responses", []))) == len(r.get("responses", []))


def test_train_and_eval_problems_are_disjoint(tasks):
    def problems(names):
        return {solve(prompt_and_response(r)[0])[0] for n in names for r in tasks[n]}

    train = problems(["sft_train", "pref_train", "prompts_train"])
    evaluation = problems(["sft_eval", "pref_eval", "prompts_eval"])
    assert train and evaluation and not train & evaluation


def test_both_languages_appear_in_every_file(tasks):
    for records in tasks.values():
        assert {(r["task"], r["lang"]) for r in records} == {("reversal", "en"), ("reversal", "zh")}


def test_training_words_are_many_and_distinct(tasks):
    # with a few thousand words the demo model memorises them instead of learning to reverse
    words = {solve(prompt_and_response(r)[0])[0] for r in tasks["sft_train"]}
    assert len(words) >= 10000


def test_build_tasks_reproduces_the_committed_files(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("build_tasks", DEMO / "build_tasks.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "build_tasks", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    module.write(module.build(module.DEFAULT_SEED), tmp_path)
    for name in TASK_FILES:
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (TASKS / f"{name}.jsonl").read_bytes(), name
