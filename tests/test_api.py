import dataclasses
import json
import subprocess
import sys

import pytest
import torch

import llmkit
from llmkit.generation import GenerateConfig, encode_prompt, generate_texts, read_prompts
from llmkit.errors import ConfigError, UserError
from llmkit.checkpoints import step_folders as ckpt
from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py


@pytest.fixture
def model(tok):
    return tiny_model(tok.vocab_size, init_std=0.3).eval()


def test_load_gives_model_and_tokenizer_from_a_run_or_a_step_folder(tmp_path, tok, model):
    run = write_checkpoint_run(tmp_path, "sft", model, tok)
    loaded, tokenizer = llmkit.load(run)
    text = "What is 12+34? 46"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text and tokenizer.bos_id not in ids
    assert not loaded.training
    from_step, _ = llmkit.load(run / "step-00000001")
    with torch.no_grad():  # (with gradients the same ops run through autograd's kernels, not llmkit's)
        logits = loaded(torch.tensor([ids, ids]))
        assert logits.shape == (2, len(ids), tok.vocab_size) and logits.dtype == torch.float32
        assert torch.equal(logits, model(torch.tensor([ids, ids])))
        assert torch.equal(from_step(torch.tensor([ids])), logits[:1])


def test_load_takes_the_step_named_by_latest(tmp_path, tok, model):
    run = write_checkpoint_run(tmp_path, "sft", model, tok)
    newer = tiny_model(tok.vocab_size, seed=9)
    step = run / ckpt.step_dir_name(2)
    step.mkdir()
    named = newer.state_dict(keep_vars=True)
    ckpt.save_weights(step / ckpt.WEIGHTS, {k: v.detach() for k, v in named.items()}, ckpt.tied_groups(named))
    (step / ckpt.MODEL_CONFIG).write_text(json.dumps(dataclasses.asdict(newer.config)))
    tok.save(step / ckpt.TOKENIZER)
    ckpt.mark_complete(step)
    x = torch.tensor([[1, 5, 9]])
    assert torch.equal(llmkit.load(run)[0](x), newer(x))
    (run / ckpt.LATEST).write_text("step-00000001\n")
    assert torch.equal(llmkit.load(run)[0](x), model(x))


def test_load_errors_say_what_is_wrong(tmp_path, tok, model):
    with pytest.raises(UserError, match="does not exist"):
        llmkit.load(tmp_path / "nope")
    run = write_checkpoint_run(tmp_path, "sft", model, tok)
    (run / "step-00000001" / ckpt.COMPLETE).unlink()
    (run / ckpt.LATEST).unlink()
    with pytest.raises(UserError, match="no complete checkpoint yet.*resume training"):
        llmkit.load(run)
    with pytest.raises(UserError, match="interrupted"):
        llmkit.load(run / "step-00000001")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no complete checkpoint"):
        llmkit.load(tmp_path / "empty")
    smaller = write_checkpoint_run(tmp_path, "small", tiny_model(tok.vocab_size - 2), tok)
    with pytest.raises(UserError, match=f"{tok.vocab_size} tokens but the model's vocab_size is {tok.vocab_size - 2}"):
        llmkit.load(smaller)
    padded = write_checkpoint_run(tmp_path, "big", tiny_model(tok.vocab_size + 2), tok)
    assert llmkit.load(padded)[0].config.vocab_size == tok.vocab_size + 2  # an embedding padded past the tokens
    reward = write_checkpoint_run(tmp_path, "rm", model, tok,
                                  config={**dataclasses.asdict(model.config), "llmkit_head": "reward"})
    with pytest.raises(UserError, match="load_reward_model"):
        llmkit.load(reward)


def test_greedy_generation_is_deterministic_and_independent_of_batching(tok, model):
    prompts = ["What is 12+34?", "计算 10+20", "Reverse: abcd"]
    cfg = GenerateConfig(max_new_tokens=12, greedy=True, batch_size=3)
    first = generate_texts(model, tok, prompts, cfg)
    assert first == generate_texts(model, tok, prompts, cfg)
    one_by_one = generate_texts(model, tok, prompts, dataclasses.replace(cfg, batch_size=1))
    assert [r["completion"] for r in one_by_one] == [r["completion"] for r in first]  # left padding is exact
    assert all(r["completion"] and r["new_tokens"] == 12 and not r["stopped"] for r in first)


def test_sampling_depends_on_the_seed_only(tok, model):
    cfg = GenerateConfig(max_new_tokens=16, temperature=1.0, top_k=50, top_p=0.95, seed=3)
    a = generate_texts(model, tok, ["What is 1+1?"], cfg)
    assert a == generate_texts(model, tok, ["What is 1+1?"], cfg)
    assert a != generate_texts(model, tok, ["What is 1+1?"], dataclasses.replace(cfg, seed=4))


def test_completion_ends_at_the_first_stop_token(tok, model, monkeypatch):
    import llmkit.model.decoding

    def fake_generate(model, ids, n, **kw):
        new = [tok.encode("46")[0], tok.end_of_turn_id, 7, tok.eos_id]
        return torch.cat([ids, torch.tensor([new] * len(ids))], dim=1)

    monkeypatch.setattr(llmkit.model.decoding, "generate", fake_generate)
    [record] = generate_texts(model, tok, ["What is 12+34?"], GenerateConfig(max_new_tokens=4, chat=True))
    assert record["completion"] == tok.decode(tok.encode("46")[:1]) and record["stopped"]
    assert record["new_tokens"] == 2


def test_prompts_become_chat_or_plain_token_ids(tok):
    assert encode_prompt(tok, "hi", chat=False) == [tok.eos_id] + tok.encode("hi")  # document_start_ids
    user = [{"role": "user", "content": "hi"}]
    expected = tok.encode_chat(user, add_generation_prompt=True)[0]
    assert encode_prompt(tok, "hi", chat=True) == expected == encode_prompt(tok, user, chat=False)
    assert expected[-1] == tok.role_ids["assistant"]


def test_long_prompts_keep_their_last_tokens(tok, model):
    cfg = GenerateConfig(max_new_tokens=model.config.max_seq_len - 8, greedy=True)
    [record] = generate_texts(model, tok, ["What is 12+34? " * 10], cfg)
    assert record["prompt_truncated"]
    with pytest.raises(ConfigError, match="max_new_tokens"):
        generate_texts(model, tok, ["x"], GenerateConfig(max_new_tokens=model.config.max_seq_len))


def test_read_prompts_from_jsonl_and_text(tmp_path):
    messages = [{"role": "user", "content": "hi"}]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a b"}) + "\n\n" + json.dumps({"messages": messages}) + "\n")
    assert read_prompts(jsonl) == ["a b", messages]
    txt = tmp_path / "p.txt"
    txt.write_text("first\n\n  second line\n")
    assert read_prompts(txt) == ["first", "  second line"]
    jsonl.write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(UserError, match=r"p.jsonl:1: .*prompt"):
        read_prompts(jsonl)


@pytest.mark.parametrize("bad", [dict(top_p=0.0), dict(top_k=0), dict(temperature=-1), dict(max_new_tokens=0)])
def test_invalid_generate_config_is_rejected(bad):
    with pytest.raises(ConfigError):
        GenerateConfig(**bad)


def mark_stage(run, stage):
    """Record `stage` as the stage that wrote `run` (the fixture writes every run as pretrain)."""
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "stage": stage}))
    return run


def test_import_llmkit_does_not_import_torch():
    code = "import sys, llmkit; llmkit.load; llmkit.generate; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_load_by_artifact_name_in_a_workspace_and_on_a_device(tmp_path, tok, model, monkeypatch):
    write_checkpoint_run(tmp_path / "ws", "sft", model, tok)
    x = torch.tensor([[1, 5, 9]])
    loaded, _ = llmkit.load("sft", workspace=tmp_path / "ws", device="cpu")
    assert torch.equal(loaded(x), model(x)) and next(loaded.parameters()).device.type == "cpu"
    monkeypatch.setenv("LLMKIT_WORKSPACE", str(tmp_path / "ws"))
    assert torch.equal(llmkit.load("sft")[0](x), model(x))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LLMKIT_WORKSPACE")
    (tmp_path / "ws").rename(tmp_path / "workspace")
    assert torch.equal(llmkit.load("sft")[0](x), model(x))  # ./workspace by default
    with pytest.raises(UserError, match=r"no checkpoint 'dpo': neither workspace/dpo nor dpo exists"):
        llmkit.load("dpo")


def test_generate_returns_the_completions(tok, model):
    prompts = ["What is 12+34?", "计算 10+20"]
    completions = llmkit.generate(model, tok, prompts, greedy=True, max_new_tokens=6)
    records = generate_texts(model, tok, prompts, GenerateConfig(greedy=True, max_new_tokens=6))
    assert completions == [r["completion"] for r in records] and all(completions)
    assert llmkit.generate(model, tok, prompts[0], greedy=True, max_new_tokens=6) == completions[0]
    with pytest.raises(ConfigError, match="did you mean 'max_new_tokens'"):
        llmkit.generate(model, tok, prompts, max_tokens=6)
    with pytest.raises(ConfigError, match="model.to"):
        llmkit.generate(model, tok, prompts, device="cuda")


@pytest.fixture
def prompt_ids_seen(tok, monkeypatch):
    """The prompt token ids `llmkit.model.decoding.generate` is asked to continue (it answers a stop token)."""
    import llmkit.model.decoding

    seen = []

    def fake_generate(model, ids, n, eos_id, **kw):
        seen.append((ids[0].tolist(), eos_id))
        return torch.cat([ids, torch.full((len(ids), 1), eos_id)], dim=1)

    monkeypatch.setattr(llmkit.model.decoding, "generate", fake_generate)
    return seen


@pytest.mark.parametrize("stage, chat", [("sft", True), ("dpo", True), ("ppo", True), ("pretrain", False)])
def test_runs_trained_on_chats_are_prompted_through_the_chat_template(tmp_path, tok, model, prompt_ids_seen,
                                                                       stage, chat):
    run = mark_stage(write_checkpoint_run(tmp_path, stage, model, tok), stage)
    loaded, tokenizer = llmkit.load(run)
    assert loaded.trained_on_chats is chat
    for chat_option in ({}, {"chat": False}, {"chat": True}):
        llmkit.generate(loaded, tokenizer, ["hi"], max_new_tokens=4, **chat_option)
    templated = (encode_prompt(tok, "hi", chat=True), tok.end_of_turn_id)
    plain = (encode_prompt(tok, "hi", chat=False), tok.eos_id)
    assert prompt_ids_seen == [templated if chat else plain, plain, templated]
