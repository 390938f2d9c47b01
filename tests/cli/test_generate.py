import json

import pytest
import torch
from typer.testing import CliRunner

import llmkit
from llmkit.generation import GenerateConfig, generate_texts
from llmkit.cli.app import build_app
from llmkit.train import checkpoint as ckpt
from tests.train.posttrain_fixtures import make_tokenizer, memorizing_model, write_checkpoint_run

runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only wait on each other
    yield
    torch.set_num_threads(before)


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
])
def test_errors_exit_2_without_traceback(ws, tmp_path, args, message):
    unfinished = tmp_path / "run"
    (unfinished / ckpt.step_dir_name(5)).mkdir(parents=True)  # a save that never completed
    r = invoke(ws, *[a.format(unfinished=unfinished) for a in args])
    assert r.exit_code == 2 and message in r.output
    assert "Traceback" not in r.output



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
