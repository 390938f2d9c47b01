"""Replay as a setting: the start model's replies to general prompts, cached per prompt as a
workspace artifact, join the batches at replay.ratio (llmkit.train.replay)."""

import json

import pytest

from llmkit.errors import ConfigError, UserError
from llmkit.train import replay as replay_module
from llmkit.train.replay import ReplayTask, WindowStream
from llmkit.train.sft import SftConfig, run_sft
from tests.conftest import write_jsonl
from tests.train.posttrain_fixtures import addition_rows, tiny_model, write_checkpoint_run, write_dataset

PROMPTS = [{"prompt": f"What is {i}+{i}?"} for i in range(6)]


@pytest.fixture
def setup(tmp_path, tok):
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "pretrain", tiny_model(tok.vocab_size), tok)
    write_dataset(ws, "sft_train", addition_rows(24))
    write_dataset(ws, "sft_eval", addition_rows(4, seed=1, start=100))
    write_jsonl(tmp_path / "general.jsonl", PROMPTS)
    return ws


def run(make_ctx, prompts=None, force=False, **overrides):
    from llmkit.core.config import parse_overrides

    base = dict(max_steps=8, micro_batch_size=4, lr=1e-2, min_lr=1e-3, warmup_steps=1, seq_len=64,
                log_every=1, eval_every=0, eval_records=0, max_new_tokens=4, threads=1,
                **({"replay.prompts": prompts, "replay.max_new_tokens": 6, "replay.batch_size": 4}
                   if prompts else {}))
    ctx = make_ctx(inputs=["sft_train"], force=force)
    ctx.overrides = parse_overrides([f"{k}={v}" for k, v in {**base, **overrides}.items()])
    return run_sft(ctx, ctx.config(SftConfig, "sft"), base="pretrain", eval_data="sft_eval")


def replay_manifest(ws) -> dict:
    return json.loads((ws / "replay-pretrain" / "manifest.json").read_text())


def test_replies_join_the_sft_batches_at_the_ratio(setup, make_ctx, tmp_path):
    prompts = tmp_path / "general.jsonl"
    b = run(make_ctx, prompts, **{"replay.ratio": 0.25})
    m = replay_manifest(setup)
    assert m["stats"] == {"prompts": 6, "reused": 0, "generated": 6}
    prov = m["provenance"]
    assert prov["max_new_tokens"] == 6 and prov["temperature"] == 0.0 and prov["model"].endswith("step-00000001")
    assert prov["prompts_fingerprint"] == m["inputs"][1]["fingerprint"]
    replies = (setup / "replay-pretrain" / "replies.jsonl").read_text().splitlines()
    assert len(replies) == 6
    run_manifest = json.loads((b.final / "manifest.json").read_text())
    assert run_manifest["stats"]["replay"]["artifact"] == "replay-pretrain"
    # one micro-batch of each block of 4 is replay (for seed 0: micro-batches 1 and 6 of 8)
    records = [json.loads(x) for x in (b.final / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "replay_loss" in r] == [2, 7]
    # the prompts file is an input of the run: a second run is up to date and generates nothing
    assert run(make_ctx, prompts, **{"replay.ratio": 0.25}).up_to_date


def test_cached_replies_regenerate_only_changed_prompts(setup, make_ctx, tmp_path, monkeypatch):
    prompts = tmp_path / "general.jsonl"
    run(make_ctx, prompts, max_steps=2)
    before = {json.loads(x)["key"]: json.loads(x)["reply"]
              for x in (setup / "replay-pretrain" / "replies.jsonl").read_text().splitlines()}
    write_jsonl(prompts, PROMPTS[:5] + [{"prompt": "Name a colour."}])
    run(make_ctx, prompts, max_steps=2, force=True)
    assert replay_manifest(setup)["stats"] == {"prompts": 6, "reused": 5, "generated": 1}
    after = {json.loads(x)["key"]: json.loads(x)["reply"]
             for x in (setup / "replay-pretrain" / "replies.jsonl").read_text().splitlines()}
    assert len(set(before) & set(after)) == 5 and all(after[k] == before[k] for k in set(before) & set(after))


def test_generation_resumes_after_a_kill(setup, make_ctx, tmp_path, monkeypatch):
    """A run killed after the first batch of replies keeps it (the builder's work folder): the
    rerun generates only the rest. The kill is an exception in the second batch (a SIGKILL leaves
    the same files: each batch is fsynced as it finishes)."""
    prompts = tmp_path / "general.jsonl"
    from llmkit.model import decoding

    calls = []
    real = decoding.generate_replies

    def dies_second_time(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(decoding, "generate_replies", dies_second_time)
    with pytest.raises(KeyboardInterrupt):
        run(make_ctx, prompts, max_steps=2)
    assert not (setup / "replay-pretrain").exists()
    monkeypatch.setattr(decoding, "generate_replies", real)
    run(make_ctx, prompts, max_steps=2)
    assert replay_manifest(setup)["stats"] == {"prompts": 6, "reused": 4, "generated": 2}


@pytest.mark.parametrize("override, message", [
    ({"replay.ratio": 0}, "replay.ratio must be in (0, 1)"),
    ({"replay.ratio": 1.5}, "replay.ratio must be in (0, 1)"),
    ({"replay.prompts": "missing.jsonl"}, "missing.jsonl: no such file"),
])
def test_bad_replay_settings_write_nothing(setup, make_ctx, tmp_path, override, message):
    override = {k: (str(tmp_path / "general.jsonl") if v == "TEXT" else v) for k, v in override.items()}
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(make_ctx, **override)
    assert not (setup / "sft").exists() and not (setup / "replay-pretrain").exists()


def test_a_replay_dataset_of_the_wrong_kind_is_named(setup, make_ctx, tmp_path):
    write_jsonl(tmp_path / "texts.jsonl", [{"text": "general text"}])
    with pytest.raises(UserError, match=r"replay.prompts=.*texts.jsonl: its rows have no `prompt` or `messages`"):
        run(make_ctx, str(tmp_path / "texts.jsonl"))
    assert not (setup / "sft").exists()


def test_replay_ratio_schedule_and_resume():
    class Counting:
        def __init__(self, tag):
            self.tag, self.n = tag, 0

        def __iter__(self):
            while True:
                self.n += 1
                yield {"from": self.tag, "n": self.n}

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, state):
            self.n = state["n"]

    class Stub:
        def __init__(self):
            self.data, self.it = Counting("task"), None

        def next_batch(self, model):
            self.it = self.it or iter(self.data)
            return next(self.it)

        def state_dict(self):
            return {"data": self.data.state_dict()}

        def load_state_dict(self, state):
            self.data.load_state_dict(state["data"])
            self.it = None

    task = ReplayTask(Stub(), Counting("replay"), 0.2, own_format=True)
    drawn = [task.next_batch(None) for _ in range(100)]
    assert sum(b.get("replay", False) for b in drawn) == 20  # one in each block of 5
    assert all(sum(b.get("replay", False) for b in drawn[k:k + 5]) == 1 for k in range(0, 100, 5))
    state = json.loads(json.dumps(task.state_dict()))
    rest = [task.next_batch(None) for _ in range(10)]
    again = ReplayTask(Stub(), Counting("replay"), 0.2, own_format=True)
    again.load_state_dict(state)
    assert [again.next_batch(None) for _ in range(10)] == rest


def test_text_windows_stream_resumes(tok, tmp_path):
    from llmkit.data.input_files import eval_input
    from llmkit.core.workspace import Workspace

    path = write_jsonl(tmp_path / "text.jsonl", [{"text": "a b c d e f g h " * 8} for _ in range(4)])
    windows = replay_module.text_windows(tok, eval_input(Workspace(tmp_path), str(path)), 17)
    assert len(windows) and all(len(w) == 17 for w in windows)
    stream = WindowStream(windows, 2, seed=0, rank=0, world=1)
    it = iter(stream)
    first = [next(it) for _ in range(3)]
    assert first[0]["input_ids"].shape == (2, 16)
    state = stream.state_dict()
    more = [next(it)["input_ids"].tolist() for _ in range(5)]
    resumed = WindowStream(windows, 2, seed=0, rank=0, world=1)
    resumed.load_state_dict(state)
    it2 = iter(resumed)
    assert [next(it2)["input_ids"].tolist() for _ in range(5)] == more


def test_replay_is_refused_where_the_stage_cannot_take_it(make_ctx):
    from llmkit.train.config import TrainConfig

    cfg = TrainConfig(replay=replay_module.ReplayConfig(prompts="x.jsonl"))
    with pytest.raises(ConfigError, match="`llmkit rm` does not take replay"):
        replay_module.replay_input(make_ctx(), "rm", cfg)
    cfg = TrainConfig(replay=replay_module.ReplayConfig(text="x.jsonl"))
    with pytest.raises(ConfigError, match="replay.text: `llmkit dpo` replays the start model's replies"):
        replay_module.replay_input(make_ctx(), "dpo", cfg)


def test_a_preference_stage_takes_the_replies_nll(tok):
    """dpo/kto/distill: a replay micro-batch's loss is the mean NLL of its reply tokens."""
    from llmkit.data.chat import collate_sft, encode_sft_rows
    from llmkit.train.posttrain import labelled_token_logps

    class Pairs:  # a stage whose own batches are not SFT rows
        pad_id = tok.pad_id

        def items_in_batch(self, batch):
            return None

    examples, _ = encode_sft_rows(tok, [{"prompt": "What is 1+1?", "response": "2"},
                                        {"prompt": "What is 2+2?", "response": "4"}], 64)
    batch = collate_sft(examples, tok.pad_id)
    task = ReplayTask(Pairs(), [batch], 0.5, own_format=False, pad_id=tok.pad_id)
    model = tiny_model(tok.vocab_size)
    tensors = {k: __import__("torch").as_tensor(v) for k, v in batch.items()}
    loss, metrics = task.loss(model, {**tensors, "replay": True})
    logps, _, _ = labelled_token_logps(model, tensors["input_ids"], tensors["labels"])
    assert float(loss) == pytest.approx(float(-logps.mean()), rel=1e-5)
    assert task.items_in_batch({"input_ids": 0}) is None and task.items_in_batch({**batch, "replay": True}) is None
    assert task.batch_tokens({**batch, "replay": True}) == int((batch["input_ids"] != tok.pad_id).sum())


def test_continued_pretraining_replays_general_text(tmp_path):
    from tests.train.test_pretrain import pretrain, token_workspace

    ws = token_workspace(tmp_path)
    pretrain(ws, "max_steps=2", "eval_every=0", "save_every=0")
    general = write_jsonl(tmp_path / "general.jsonl", [{"text": "the cat sat on the mat. " * 20} for _ in range(3)])
    pretrain(ws, "max_steps=4", "warmup_steps=0", "eval_every=0", "save_every=0", f"replay.text={general}",
             "replay.ratio=0.5", extra=["--from", "pretrain", "--out", "more"])
    m = json.loads((ws / "more" / "manifest.json").read_text())
    assert m["stats"]["replay"]["windows"] > 0 and str(general) in {i["path"] for i in m["inputs"]}
    records = [json.loads(x) for x in (ws / "more" / "metrics.jsonl").read_text().splitlines()]
    assert 1 <= sum("replay_loss" in r for r in records) <= 3
    out = pretrain(ws, "max_steps=4", f"replay.prompts={general}", extra=["--from", "pretrain", "--out", "x"],
                   expect=2).output
    assert "pretraining replays general text; use replay.text" in out


def test_sft_replays_text_with_the_loss_on_every_token(setup, make_ctx, tmp_path, tok):
    """InstructGPT's pretraining mix: text windows join the SFT batches at the ratio, each one's
    loss the mean NLL of every next token (not only a reply's)."""
    import torch
    from llmkit.core.workspace import Workspace
    from llmkit.train.sft import SftTask

    general = write_jsonl(tmp_path / "general_text.jsonl", [{"text": f"the cat {i} sat on the mat. " * 12}
                                                            for i in range(4)])
    b = run(make_ctx, **{"replay.text": str(general), "replay.ratio": 0.25})
    m = json.loads((b.final / "manifest.json").read_text())
    assert m["stats"]["replay"]["windows"] > 0 and str(general) in {i["path"] for i in m["inputs"]}
    records = [json.loads(x) for x in (b.final / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "replay_loss" in r] == [2, 7]  # as the replies' schedule

    windows = replay_module.text_windows(tok, replay_module.eval_input(Workspace(tmp_path), str(general)), 16)
    batch = next(iter(WindowStream(windows, 2, seed=0, rank=0, world=1, shifted=False)))
    ids = torch.as_tensor(batch["input_ids"])
    assert ids.shape == (2, 16) and (batch["labels"] == batch["input_ids"]).all()
    model = tiny_model(tok.vocab_size)
    loss, _ = SftTask(model, None, None, 16, tok.pad_id).loss(model, {"input_ids": ids, "labels": ids})
    logps = torch.log_softmax(model(ids)[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])
    assert float(loss) == pytest.approx(float(-logps.mean()), rel=1e-5)


def test_a_tokens_artifact_replays_its_train_split_of_its_own_tokenizer(tmp_path, tok):
    from llmkit.core.workspace import Workspace
    from llmkit.data.loader import split_tokens
    from tests.train.test_pretrain import token_workspace

    ws = Workspace(token_workspace(tmp_path))
    art = ws.artifact("tokens")
    train, val = split_tokens(art.path, "train"), split_tokens(art.path, "val")
    assert len(val) > 0  # the val documents exist, and are not replayed
    windows = replay_module.text_windows(None, art, 33)
    assert windows.shape == (len(train) // 33, 33)
    assert (windows.reshape(-1) == train[:windows.size]).all()
    replay_module.require_tokenizer_of_the_run(art, ws, ws.root / "tokenizer")
    with pytest.raises(ConfigError, match=r"replay.text=.*tokens: tokenized with .* another tokenizer"):
        replay_module.require_tokenizer_of_the_run(art, ws, tok.path)
