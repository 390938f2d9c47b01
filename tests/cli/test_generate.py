import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import llmkit
from llmkit.generation import GenerateConfig, generate_texts
from llmkit.cli.app import build_app
from llmkit.checkpoints import step_folders as ckpt
from llmkit.model import packed_linear
from llmkit.model.cpu_kernels import low_precision_available
from tests.train.posttrain_fixtures import make_tokenizer, memorizing_model, write_checkpoint_run

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py


PLAIN = {"What is 12+34?": " 46", "计算 10+20": " 等于 30"}  # prompt -> its continuation
CHATS = {"What is 12+34?": "46", "Reverse: abcd": "dcba"}  # user turn -> the assistant's reply


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A run (stage pretrain: plain prompts) of a model that learnt PLAIN as documents and CHATS
    as conversations by heart, so every completion below is known."""
    root = tmp_path_factory.mktemp("ws")
    tok = make_tokenizer(root / "tok")
    docs = [tok.document_start_ids() + tok.encode(p + c) + [tok.eos_id] for p, c in PLAIN.items()]
    chats = [tok.encode_chat([{"role": "user", "content": p}, {"role": "assistant", "content": r}])[0]
             for p, r in CHATS.items()]
    write_checkpoint_run(root, "sft", memorizing_model(tok, docs + chats), tok)
    return root


def invoke(ws, *args):
    return runner.invoke(build_app(), ["generate", "-w", str(ws), *args])


def test_generate_prints_completions_and_greedy_is_deterministic(ws):
    args = ["--from", "sft", "--prompt", "What is 12+34?", "--prompt", "计算 10+20",
            "--set", "greedy=true", "--set", "max_new_tokens=8"]
    first = invoke(ws, *args)
    assert first.exit_code == 0, first.output
    assert first.stdout == ">>> What is 12+34?\n 46\n\n>>> 计算 10+20\n 等于 30\n\n"
    assert invoke(ws, *args).output == first.output


def test_prompts_file_chat_and_jsonl_output(ws, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 12+34?"}) + "\n"
                       + json.dumps({"messages": [{"role": "user", "content": "Reverse: abcd"}]}) + "\n")
    out = tmp_path / "gen.jsonl"
    r = invoke(ws, "--from", str(ws / "sft" / "step-00000001"), "--prompts", str(prompts), "--output", str(out),
               "--set", "chat=true", "--set", "max_new_tokens=6", "--set", "greedy=true")
    assert r.exit_code == 0, r.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["What is 12+34?", [{"role": "user", "content": "Reverse: abcd"}]]
    assert [r["completion"] for r in records] == ["46", "dcba"]
    assert all(r["stopped"] and not r["prompt_truncated"] for r in records)
    tok = llmkit.load(ws / "sft")[1]
    assert [r["new_tokens"] for r in records] == [len(tok.encode(c)) + 1 for c in ("46", "dcba")]  # + <|end|>


@pytest.mark.parametrize("args, message", [
    (["--from", "missing", "--prompt", "x"], "no checkpoint 'missing'"),
    (["--from", "{unfinished}", "--prompt", "x"], "no complete checkpoint"),
    (["--from", "sft"], "--prompt"),
    (["--from", "sft", "--prompt", "x", "--set", "temprature=0.5"], "temperature"),
    (["--from", "sft", "--prompt", "x", "--set", "verify=true"], "verify=true keeps float32's greedy tokens"),
])
def test_errors_exit_2_without_traceback(ws, tmp_path, args, message):
    unfinished = tmp_path / "run"
    (unfinished / ckpt.step_dir_name(5)).mkdir(parents=True)  # a save that never completed
    r = invoke(ws, *[a.format(unfinished=unfinished) for a in args])
    assert r.exit_code == 2 and message in r.output
    assert "Traceback" not in r.output



@pytest.mark.skipif(not low_precision_available("int8"), reason="needs the int8 kernels")
def test_int8_weights_verified_print_the_fp32_completions(ws, monkeypatch):
    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 1)  # the tiny model's matrices converted as SmolLM2's
    args = ["--from", "sft", "--prompt", "What is 12+34?", "--prompt", "计算 10+20", "--set", "greedy=true",
            "--set", "max_new_tokens=8"]
    verified = invoke(ws, *args, "--set", "decode.weights=int8", "--set", "verify=true")
    assert verified.exit_code == 0, verified.output
    assert verified.stdout == invoke(ws, *args).stdout


def test_a_run_trained_on_chats_gets_the_chat_template_unless_chat_false(ws):
    model, tok = llmkit.load(ws / "sft")
    run = write_checkpoint_run(ws, "ppo", model, tok)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "stage": "ppo"}))
    args = ["--from", "ppo", "--prompt", "What is 12+34?", "--set", "greedy=true", "--set", "max_new_tokens=8"]
    default, templated, plain = (invoke(ws, *args, *extra) for extra in
                                 ([], ["--set", "chat=true"], ["--set", "chat=false"]))
    assert default.exit_code == templated.exit_code == plain.exit_code == 0, default.output
    assert "trained on chats" in default.stderr and "--set chat=false" in default.stderr
    assert default.stdout == templated.stdout == ">>> What is 12+34?\n46\n\n"
    assert plain.stdout == ">>> What is 12+34?\n 46\n\n"
    assert "trained on chats" not in plain.output + templated.output
    model, tok = llmkit.load(run)
    config = GenerateConfig(greedy=True, max_new_tokens=8, chat=False)
    [record] = generate_texts(model, tok, ["What is 12+34?"], config)
    assert plain.stdout == f">>> What is 12+34?\n{record['completion']}\n\n"


@pytest.fixture
def first_ids_then(monkeypatch):
    """`llmkit.model.decoding.generate` answering each prompt with the ids set in `answer` (default:
    the stop token at once), recording the prompt ids and stop id it was given."""
    import llmkit.model.decoding

    seen, answer = [], []

    def fake_generate(model, ids, n, eos_id, **kw):
        seen.append((ids[0].tolist(), eos_id))
        new = torch.tensor([(answer or [eos_id])[:n]] * len(ids))
        return torch.cat([ids, new], dim=1)

    monkeypatch.setattr(llmkit.model.decoding, "generate", fake_generate)
    return seen, answer


def test_a_reply_cut_at_the_token_limit_inside_a_character_drops_its_first_bytes(ws, first_ids_then):
    _, answer = first_ids_then
    model, tok = llmkit.load(ws / "sft")
    ids = tok.encode(" 等于 龘")  # 龘 is not in the vocabulary: three byte tokens
    assert [tok.id_to_piece(i) for i in ids[-3:]] == ["<0xE9>", "<0xBE>", "<0x98>"]
    answer.extend(ids)
    config = GenerateConfig(max_new_tokens=len(ids) - 1, chat=False)
    [cut] = generate_texts(model, tok, ["计算 10+20"], config)
    assert cut["completion"] == " 等于 " and not cut["stopped"]
    [whole] = generate_texts(model, tok, ["计算 10+20"], GenerateConfig(max_new_tokens=len(ids), chat=False))
    assert whole["completion"] == " 等于 龘"


def test_an_empty_completion_is_a_warning_naming_the_prompt_format_to_try(ws, first_ids_then):
    args = ["--from", "sft", "--prompt", "What is 12+34?", "--prompt", "x", "--set", "max_new_tokens=4"]
    plain = invoke(ws, *args)
    assert plain.exit_code == 0, plain.output
    assert plain.stdout == ">>> What is 12+34?\n\n\n>>> x\n\n\n"
    assert "warning: every completion is empty" in plain.stderr and "--set chat=true" in plain.stderr
    chat = invoke(ws, *args, "--set", "chat=true")
    assert chat.exit_code == 0 and "--set chat=false" in chat.stderr


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A workspace with a tiny Qwen2 folder imported twice: `instruct` (its tokenizer has a chat
    template) and `base` (the same folder without one)."""
    import transformers

    from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe

    root = tmp_path_factory.mktemp("imported")
    config = transformers.Qwen2Config(vocab_size=832, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    for name, template in (("instruct", QWEN25_TEMPLATE), ("base", None)):
        folder = save_folder(root / name, train_bpe(QWEN_SPECIALS), template, eos_token="<|im_end|>")
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
        r = runner.invoke(build_app(), ["import", "--from", str(folder), "--out", name, "-w", str(root / "ws")])
        assert r.exit_code == 0, r.output
    return root


def test_an_imported_model_whose_tokenizer_has_a_chat_template_is_prompted_through_it(imported, first_ids_then):
    seen, _ = first_ids_then
    ws = imported / "ws"
    for name in ("instruct", "base"):
        r = invoke(ws, "--from", name, "--prompt", "What is 12+34?", "--set", "max_new_tokens=2")
        assert r.exit_code == 0, r.output
    instruct, base = (llmkit.load(name, workspace=ws) for name in ("instruct", "base"))
    assert instruct[0].trained_on_chats and not base[0].trained_on_chats
    tok = instruct[1]
    assert seen == [(tok.encode_chat([{"role": "user", "content": "What is 12+34?"}], add_generation_prompt=True)[0],
                     tok.end_of_turn_id),
                    (base[1].document_start_ids() + base[1].encode("What is 12+34?"), base[1].eos_id)]


def test_an_imported_model_says_it_gets_the_chat_template_and_how_to_turn_it_off(imported, first_ids_then):
    r = invoke(imported / "ws", "--from", "instruct", "--prompt", "hi", "--set", "max_new_tokens=2")
    assert r.exit_code == 0 and "prompts go through the chat template" in r.stderr
    assert "imported model whose tokenizer has a chat template" in r.stderr and "--set chat=false" in r.stderr
    r = invoke(imported / "ws", "--from", "base", "--prompt", "hi", "--set", "max_new_tokens=2")
    assert r.exit_code == 0 and "prompts go through the chat template" not in r.stderr


def test_eval_prompts_the_models_generate_would_prompt_through_their_template(imported, monkeypatch):
    import llmkit.eval.stage as stage

    seen, original = [], stage.EvalRun
    monkeypatch.setattr(stage, "EvalRun", lambda *args: seen.append(original(*args).chat) or original(*args))
    questions = Path(__file__).resolve().parents[2] / "recipes/demo/data/eval/generation_en.jsonl"
    for name in ("instruct", "base"):
        r = runner.invoke(build_app(), ["eval", "-w", str(imported / "ws"), "--from", name, "--set", "tasks=generation",
                                        "--set", f"generation.files={questions}", "--set", "generation.max_examples=1",
                                        "--set", "generation.max_new_tokens=2"])
        assert r.exit_code == 0, r.output
    assert seen == [True, False]
