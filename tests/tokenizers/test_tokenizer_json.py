"""The Hugging Face tokenizer backend against transformers on the folders transformers writes:
tiny byte-level BPE tokenizers trained here in the Qwen2 and Llama 3 styles, with chat
templates in the styles of Qwen2.5, Llama 3, Qwen3 and one with {% generation %} blocks."""

import json
import random
import re
import shutil

import numpy as np
import pytest

from llmkit.errors import UserError
from llmkit.tokenizers.tokenizer_json import HFTokenizer
from llmkit.tokenizers.sentencepiece import Tokenizer, open_tokenizer, same_tokenizer
from tests.tokenizers.test_sentencepiece import build_tokenizer, small_corpus

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")



def corpus(n: int = 240, seed: int = 0) -> list[str]:
    """A few KB of English, Chinese, code and emoji: enough for ~800 byte-level BPE tokens."""
    rng = random.Random(seed)
    words = ["the", "model", "data", "token", "train", "value", "return", "error", "file", "what",
             "they'll", "isn't", "it's", "hello", "world", "answer", "question", "think", "code"]
    han = "我们的数据模型训练中文分词语言大学生活动工作时间问题你好世界今天天气很好"
    docs = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            docs.append(" ".join(rng.choice(words) for _ in range(30)) + ".\n")
        elif kind == 1:
            docs.append(f"def f{i}(x):\n    if x > {i}:\n\t\treturn  x + {rng.randint(0, 99)}  # "
                        f"{rng.choice(words)}\r\n")
        elif kind == 2:
            docs.append("".join(rng.choice(han) for _ in range(40)) + "。\n")
        else:
            docs.append(f"{rng.choice(words)} 中文 😀🎉 {i * 37} café naïve\tmixed 👩‍👩‍👧\n")
    return docs


PROBE_TEXTS = [
    "Hello world, this is a test.",
    "你好，世界！我们来测试一下中文。",
    "def f(x):\n\treturn x ** 2  # square\r\n",
    "emoji 😀🎉👩‍👩‍👧 and 🇨🇳",
    "   leading and trailing spaces   \n\n\n",
    "NFD e\u0301 vs NFC é, ligature ﬁ",
    "special tokens inside text: <|im_end|> <|endoftext|> <|eot_id|>",
    "", " ", "\n",
]

QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# Qwen3's way: replies after the last user message keep their <think> block (an empty one is
# written when there is none), earlier replies lose it
QWEN3_TEMPLATE = """
{%- set ns = namespace(last_query_index=0) %}
{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query_index = loop.index0 %}{%- endif %}{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'assistant' %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in message.content %}
            {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

GENERATION_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>\n' }}"
    "{% endgeneration %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

CHATS = {
    "one turn": [{"role": "user", "content": "What is 2+2?"},
                 {"role": "assistant", "content": "2+2 is 4."}],
    "system, two turns": [
        {"role": "system", "content": "You answer in Chinese and English."},
        {"role": "user", "content": "Say hello"},
        {"role": "assistant", "content": "你好！Hello 😀"},
        {"role": "user", "content": "Now write code"},
        {"role": "assistant", "content": "def f(x):\n    return x + 1"}],
    # the reply's text is also in the question: it must be found in the reply's own turn
    "reply inside the question": [
        {"role": "user", "content": "Repeat after me: hello"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again: hello"},
        {"role": "assistant", "content": "hello"}],
}


# -- fixtures: folders as transformers' save_pretrained writes them -------------------------

def train_bpe(specials: list[str], start: str | None = None):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    if start is None:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:  # Llama 3: every text starts with <|begin_of_text|> when special tokens are added
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{start} $A", pair=f"{start} $A {start} $B",
                                          special_tokens=[(start, tok.token_to_id(start))])])
    return tok


def save_folder(path, backend, template=None, **special):
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=template, **special).save_pretrained(path)
    return path


MISTRAL_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
                    "{{ '[INST] ' + m['content'] + ' [/INST]' }}{% else %}{{ m['content'] + eos_token }}"
                    "{% endif %}{% endfor %}")


def save_mistral_folder(path):
    """A tokenizer folder as Mistral, Mixtral and Llama 2 publish theirs: a sentencepiece
    `tokenizer.model` with a dummy prefix (which llmkit's own sentencepiece encoder does not
    reproduce) beside the `tokenizer.json` transformers converts from it."""
    import io

    import sentencepiece as spm
    from transformers import AutoTokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=model, vocab_size=500, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2)
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.model").write_bytes(model.getvalue())
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "legacy": False, "add_bos_token": True}))
    AutoTokenizer.from_pretrained(path, chat_template=MISTRAL_TEMPLATE).save_pretrained(path)  # + tokenizer.json
    return path


QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    qwen, llama = train_bpe(QWEN_SPECIALS), train_bpe(LLAMA_SPECIALS, start="<|begin_of_text|>")
    chatml = dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")
    return {
        "qwen2.5": save_folder(root / "qwen2.5", qwen, QWEN25_TEMPLATE, **chatml),
        "qwen-base": save_folder(root / "qwen-base", qwen, eos_token="<|endoftext|>"),
        # Qwen2.5's base models: eos <|endoftext|>, and the instruct model's ChatML template
        "qwen2.5-base": save_folder(root / "qwen2.5-base", qwen, QWEN25_TEMPLATE, eos_token="<|endoftext|>"),
        "qwen3": save_folder(root / "qwen3", qwen, QWEN3_TEMPLATE, **chatml),
        "generation": save_folder(root / "generation", qwen, GENERATION_TEMPLATE, **chatml),
        "llama3": save_folder(root / "llama3", llama, LLAMA3_TEMPLATE, bos_token="<|begin_of_text|>",
                              eos_token="<|eot_id|>"),
    }


@pytest.fixture(scope="module")
def ours(folders):
    return {name: HFTokenizer(path) for name, path in folders.items()}


@pytest.fixture(scope="module")
def theirs(folders):
    from transformers import AutoTokenizer

    return {name: AutoTokenizer.from_pretrained(path) for name, path in folders.items()}


def their_chat_ids(hf, messages, add_generation_prompt):
    out = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def masked_runs(tok: HFTokenizer, ids, mask) -> list[str]:
    """The text of each run of masked tokens, special tokens included."""
    runs, run = [], []
    for i, m in zip([*ids, None], [*mask, 0]):
        if m:
            run.append(i)
        elif run:
            runs.append(tok.backend.decode(run, skip_special_tokens=False))
            run = []
    return runs


# -- ids --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["qwen2.5", "llama3"])
def test_ids_and_decoding_equal_transformers(ours, theirs, name):
    tok, hf = ours[name], theirs[name]
    expected = [hf.encode(t, add_special_tokens=False) for t in PROBE_TEXTS]
    assert [tok.encode(t) for t in PROBE_TEXTS] == expected
    assert tok.encode_batch(PROBE_TEXTS) == expected
    assert any(len(set(ids)) > 3 for ids in expected)  # real merges, not a degenerate vocabulary
    with_specials = expected[-4] + [tok.eos_id, tok.end_of_turn_id] + expected[0]
    assert tok.decode(with_specials) == hf.decode(with_specials, skip_special_tokens=True)
    assert tok.decode(np.array(expected[1])) == "你好，世界！我们来测试一下中文。"


def test_special_tokens_in_text_are_their_ids_and_decode_to_nothing(ours):
    tok = ours["qwen2.5"]
    ids = tok.encode("a<|im_end|>b")
    assert tok.piece_to_id("<|im_end|>") in ids
    assert tok.decode(ids) == "ab"


def test_encode_flat_and_encode_utf8_count_each_text_with_its_end(ours):
    tok = ours["qwen2.5"]
    texts = [t for t in PROBE_TEXTS if "<|" not in t]  # a special token string is plain text here (tested below)
    ids, counts = tok.encode_flat(texts)
    assert ids.dtype == np.int32 and counts.dtype == np.int64
    assert counts.tolist() == [len(tok.encode(t)) for t in texts]
    raw = b"".join(t.encode("utf-8") for t in texts)
    ends = np.cumsum([len(t.encode("utf-8")) for t in texts])
    ids, counts = tok.encode_utf8(np.frombuffer(raw, np.uint8), ends, end_id=tok.eos_id)
    assert ids.dtype == np.int32 and counts.dtype == np.int64
    assert ids.tolist() == [i for t in texts for i in [*tok.encode(t), tok.eos_id]]
    assert counts.tolist() == [len(tok.encode(t)) + 1 for t in texts]
    assert tok.for_another_thread().encode(texts[1]) == tok.encode(texts[1])


@pytest.mark.parametrize("name", ["llama3", "qwen2.5"])
def test_the_tokenize_stage_writes_each_document_between_its_start_and_its_end(ours, name):
    """Llama 3 starts every document with <|begin_of_text|> (its document start); Qwen's documents
    follow the previous one's <|endoftext|> with nothing before them, as llmkit's own do."""
    import pyarrow as pa

    from llmkit.data.tokenize import TokenizeConfig, encode_documents

    tok = ours[name]
    start = [tok.bos_id] if name == "llama3" else []
    texts = ["first document", "第二个文档 😀"]
    batch = pa.record_batch([pa.array(["a", "b"]), pa.array(texts)], names=["id", "text"])
    train, val, lengths, _ = encode_documents([batch], TokenizeConfig(val_fraction=0.0), tok)
    assert train.tolist() == [*start, *tok.encode(texts[0]), tok.eos_id,
                              *start, *tok.encode(texts[1]), tok.eos_id]
    assert lengths.tolist() == [len(start) + len(tok.encode(t)) + 1 for t in texts] and len(val) == 0


@pytest.mark.parametrize("name", ["qwen2.5", "llama3"])
def test_special_token_strings_inside_a_document_are_plain_text_in_the_token_shards(ours, folders, name):
    """A web page quoting <|endoftext|> stays one document: its text encodes as transformers'
    split_special_tokens=True encodes it, and the one document end is the real one after it."""
    import pyarrow as pa
    from transformers import AutoTokenizer

    from llmkit.data.tokenize import TokenizeConfig, encode_documents
    from llmkit.eval.perplexity import text_documents

    tok = ours[name]
    text = "GPT-2 ends documents with <|endoftext|>, Llama 3 with <|end_of_text|>; a turn with <|eot_id|>."
    batch = pa.record_batch([pa.array(["page"]), pa.array([text])], names=["id", "text"])
    train, _, lengths, _ = encode_documents([batch], TokenizeConfig(val_fraction=0.0), tok)
    plain = AutoTokenizer.from_pretrained(folders[name], split_special_tokens=True).encode(
        text, add_special_tokens=False)
    start = [tok.bos_id] if name == "llama3" else []
    assert train.tolist() == [*start, *plain, tok.eos_id] and lengths.tolist() == [len(start) + len(plain) + 1]
    assert not {tok.eos_id, tok.end_of_turn_id, tok.bos_id} & set(plain)
    assert tok.decode(train) == text
    # perplexity (eval, ppl-filter) scores the document as it is trained on
    assert text_documents(tok, [text]) == [[*tok.document_start_ids(), *plain, tok.eos_id]]
    assert tok.eos_id in tok.encode(text)  # a prompt still reads them as transformers' tokenizer(text) does


# -- special tokens: document end, end of turn, start ----------------------------------------

def test_qwen_has_no_bos_its_documents_end_with_endoftext_and_turns_with_im_end(ours):
    tok = ours["qwen2.5"]
    endoftext, im_end = tok.piece_to_id("<|endoftext|>"), tok.piece_to_id("<|im_end|>")
    assert tok.bos_id is None
    assert tok.eos_id == endoftext and tok.end_of_turn_id == im_end  # the config's eos is <|im_end|>
    assert set(tok.stop_ids) == {endoftext, im_end}
    assert tok.document_start_ids() == [endoftext]
    assert tok.pad_id == endoftext and tok.vocab_size == tok.backend.get_vocab_size(with_added_tokens=True)


def test_llama3_starts_documents_with_begin_of_text_and_ends_them_with_end_of_text(ours, theirs):
    tok = ours["llama3"]
    begin, end, eot = (tok.piece_to_id(t) for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"))
    assert tok.bos_id == begin and tok.eos_id == end and tok.end_of_turn_id == eot
    assert tok.document_start_ids() == [begin] == theirs["llama3"]("x")["input_ids"][:1]
    assert tok.encode("x") == theirs["llama3"].encode("x", add_special_tokens=False)  # no <|begin_of_text|>
    assert set(tok.stop_ids) == {end, eot} and tok.pad_id == end


def test_the_end_of_turn_is_what_the_template_writes_after_a_reply_not_the_configs_eos(ours):
    tok = ours["qwen2.5-base"]
    assert tok.eos_id == tok.piece_to_id("<|endoftext|>") == tok.piece_to_id(tok.special_tokens["eos_token"])
    assert tok.end_of_turn_id == tok.piece_to_id("<|im_end|>")
    ids, mask = tok.encode_chat(CHATS["one turn"])
    assert masked_runs(tok, ids, mask) == ["2+2 is 4.<|im_end|>"]


def test_a_base_model_without_a_template_ends_turns_with_its_eos(ours):
    tok = ours["qwen-base"]
    assert tok.eos_id == tok.end_of_turn_id == tok.piece_to_id("<|endoftext|>")


def test_config_tokens_may_be_dicts_and_one_missing_from_the_vocabulary_is_a_user_error(folders, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(folders["qwen2.5"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["pad_token"] = {"content": "<|im_start|>", "special": True}  # an AddedToken, as a dict
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert HFTokenizer(folder).pad_id == HFTokenizer(folder).piece_to_id("<|im_start|>")
    config["eos_token"] = {"content": "<|nowhere|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=re.escape("eos_token '<|nowhere|>' is not a token of")):
        HFTokenizer(folder)


# -- chats --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["qwen2.5", "llama3", "qwen3", "generation"])
@pytest.mark.parametrize("chat", list(CHATS))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_chat_ids_equal_apply_chat_template(ours, theirs, name, chat, add_generation_prompt):
    messages = CHATS[chat]
    ids, mask = ours[name].encode_chat(messages, add_generation_prompt=add_generation_prompt)
    assert ids == their_chat_ids(theirs[name], messages, add_generation_prompt)
    assert len(mask) == len(ids)
    assert ours[name].format_chat(messages, add_generation_prompt) == theirs[name].apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("name", ["qwen2.5", "llama3"])
@pytest.mark.parametrize("chat", list(CHATS))
def test_the_loss_mask_is_each_reply_and_its_end_of_turn(ours, name, chat):
    tok, messages = ours[name], CHATS[chat]
    ids, mask = tok.encode_chat(messages)
    eot = tok.id_to_piece(tok.end_of_turn_id)
    assert masked_runs(tok, ids, mask) == [m["content"] + eot for m in messages if m["role"] == "assistant"]


def test_a_generation_prompt_is_never_learnt(ours):
    ids, mask = ours["qwen2.5"].encode_chat(CHATS["one turn"][:1], add_generation_prompt=True)
    assert not any(mask) and ours["qwen2.5"].decode(ids).endswith("assistant\n")


def test_a_trimmed_reply_is_masked_as_the_template_writes_it(ours):
    tok = ours["llama3"]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  spaced out \n"}]
    ids, mask = tok.encode_chat(messages)
    assert masked_runs(tok, ids, mask) == ["spaced out<|eot_id|>"]


def test_qwen3_masks_what_each_turn_renders_of_its_reasoning(ours, theirs):
    tok = ours["qwen3"]
    final = "<think>\nthe user asks again\n</think>\n\n最后的回答 final"
    messages = [{"role": "user", "content": "first question"},
                {"role": "assistant", "content": "<think>\nI think hard\n</think>\n\nfirst answer"},
                {"role": "user", "content": "second question"},
                {"role": "assistant", "content": final}]
    ids, mask = tok.encode_chat(messages)
    assert ids == their_chat_ids(theirs["qwen3"], messages, False)
    # the earlier reply's reasoning is not in the rendered chat; the final one's is, and is learnt
    assert "I think hard" not in tok.format_chat(messages)
    assert masked_runs(tok, ids, mask) == ["first answer<|im_end|>", final + "<|im_end|>"]


def test_generation_blocks_give_transformers_assistant_mask(ours, theirs):
    for chat in CHATS.values():
        ids, mask = ours["generation"].encode_chat(chat)
        out = theirs["generation"].apply_chat_template(chat, tokenize=True, return_dict=True,
                                                       return_assistant_tokens_mask=True)
        assert ids == list(out["input_ids"]) and mask == list(out["assistant_masks"])
        # the block holds the newline after <|im_end|> too: the mask follows the block
        assert masked_runs(ours["generation"], ids, mask) == [
            m["content"] + "<|im_end|>\n" for m in chat if m["role"] == "assistant"]


def test_a_chat_without_a_template_is_a_user_error_naming_the_folder(ours, folders):
    with pytest.raises(UserError, match="no chat template.*chat_template.jinja") as e:
        ours["qwen-base"].encode_chat(CHATS["one turn"])
    assert str(folders["qwen-base"]) in str(e.value)
    with pytest.raises(UserError, match="no chat template"):
        ours["qwen-base"].format_chat(CHATS["one turn"])


def test_a_template_that_refuses_the_chat_is_a_user_error(folders, tmp_path):
    folder = tmp_path / "strict"
    shutil.copytree(folders["qwen-base"], folder)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}"
        "{% endif %}{{ m.content }}<|im_end|>{% endfor %}")
    with pytest.raises(UserError, match="refused the conversation: no system role"):
        HFTokenizer(folder).encode_chat([{"role": "system", "content": "x"}])
    with pytest.raises(UserError, match="message 0.*content must be a string"):
        HFTokenizer(folder).encode_chat([{"role": "user", "content": None}])


ENVIRONMENT_TEMPLATE = """
{%- set ns = namespace(n=0) %}
{{- bos_token | default('no bos') }}|{{ eos_token }}|{{ tools is none }}|
{%- for m in messages %}
    {%- if loop.index > 2 %}{% break %}{% endif %}
    {%- set ns.n = ns.n + 1 %}
    {{- m | tojson }}
{% endfor %}
{{- ns.n }}|{{ strftime_now('%Y') | length }}
    {% if messages %}
block tags keep no indent and no newline
    {% endif %}
{{ 'end' }}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
"""


def test_templates_see_what_transformers_gives_them(folders, tmp_path):
    """trim/lstrip blocks, loop controls, namespace, transformers' tojson (no HTML escaping, no
    ASCII escapes), strftime_now, the named special tokens and tools=None."""
    from transformers import AutoTokenizer

    folder = tmp_path / "environment"
    shutil.copytree(folders["qwen2.5"], folder)
    (folder / "chat_template.jinja").write_text(ENVIRONMENT_TEMPLATE)
    chat = [{"role": "user", "content": "<b>你好</b> & \"quotes\""}, *CHATS["one turn"]]
    for prompt in (False, True):
        text = HFTokenizer(folder).format_chat(chat, prompt)
        assert text == AutoTokenizer.from_pretrained(folder).apply_chat_template(
            chat, tokenize=False, add_generation_prompt=prompt)
    assert "<b>你好</b>" in text and text.startswith("no bos|<|im_end|>|True|")


@pytest.mark.parametrize("stored", ["string", "named list"])
def test_the_template_may_live_in_tokenizer_config(folders, tmp_path, ours, stored):
    folder = tmp_path / stored
    shutil.copytree(folders["qwen2.5"], folder)
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = QWEN25_TEMPLATE if stored == "string" else [
        {"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
        {"name": "default", "template": QWEN25_TEMPLATE}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    chat = CHATS["system, two turns"]
    assert HFTokenizer(folder).encode_chat(chat) == ours["qwen2.5"].encode_chat(chat)


# -- folders ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sentencepiece_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sp")
    build_tokenizer(folder, small_corpus(), vocab_size=400)
    return folder


def test_open_tokenizer_picks_the_backend_by_the_folders_files(folders, sentencepiece_folder, tmp_path):
    assert type(open_tokenizer(folders["qwen2.5"])) is HFTokenizer
    assert type(open_tokenizer(sentencepiece_folder)) is Tokenizer
    with pytest.raises(UserError, match="tokenizer.model.*tokenizer.json"):
        open_tokenizer(tmp_path)


def test_save_copies_the_folder_and_same_tokenizer_compares_the_backend_file(
        ours, folders, sentencepiece_folder, tmp_path):
    ours["qwen2.5"].save(tmp_path / "copy")
    assert {p.name for p in (tmp_path / "copy").iterdir()} == {p.name for p in folders["qwen2.5"].iterdir()}
    copy = open_tokenizer(tmp_path / "copy")
    assert copy.encode_chat(CHATS["one turn"]) == ours["qwen2.5"].encode_chat(CHATS["one turn"])
    assert same_tokenizer(tmp_path / "copy", folders["qwen2.5"])
    assert same_tokenizer(folders["qwen3"], folders["qwen2.5"])  # same tokenizer.json, another template
    assert not same_tokenizer(folders["llama3"], folders["qwen2.5"])
    assert not same_tokenizer(sentencepiece_folder, folders["qwen2.5"])
    assert same_tokenizer(sentencepiece_folder, sentencepiece_folder)
    assert not same_tokenizer(tmp_path, tmp_path)  # no tokenizer at all
