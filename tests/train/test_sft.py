import json

import pytest
import torch

from llmkit.data.chat import collate_sft, encode_conversation, packed_row
from llmkit.errors import ConfigError, UserError
from llmkit.train.losses import token_logps
from llmkit.checkpoints.loading import load_model
from llmkit.train.posttrain import evaluate_exact_match, generate_replies, labelled_token_logps
from llmkit.train.sft import SftConfig, run_sft
from tests.make_fragments import make_command
from tests.train.reference_losses import sft_loss
from tests.train.posttrain_fixtures import (addition_rows, tiny_model, write_checkpoint_run,
                                            write_dataset)


@pytest.fixture
def setup(tmp_path, tok):
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "pretrain", tiny_model(tok.vocab_size), tok)
    write_dataset(ws, "sft_train", addition_rows(48))
    write_dataset(ws, "sft_eval", addition_rows(8, seed=1, start=100))
    return ws


def fast(**overrides) -> dict:
    base = dict(max_steps=12, micro_batch_size=4, lr=1e-2, min_lr=1e-3, warmup_steps=2,
                seq_len=64, log_every=1, eval_every=0, eval_records=8, max_new_tokens=4)
    return {k: str(v) for k, v in {**base, **overrides}.items()}


def run(make_ctx, ws, force=False, train="sft_train", eval_data="sft_eval", **overrides):
    from llmkit.core.config import _Raw

    ctx = make_ctx(inputs=[train], force=force)
    ctx.overrides = {k: _Raw(v) for k, v in fast(**overrides).items()}
    return run_sft(ctx, ctx.config(SftConfig, "sft"), base="pretrain", eval_data=eval_data)


def sums_to(total: int, n: int, start: int = 0) -> list[dict]:
    """SFT rows (prompt/response and messages alternately) whose answer is `total`:
    "What is a+b?" with a + b = total."""
    rows = []
    for i in range(n):
        prompt, answer = f"What is {10 + i}+{total - 10 - i}?", str(total)
        row = {"id": f"t{total}-{start + i}", "answer": answer, "messages": None, "prompt": None,
               "response": None}
        if i % 2:
            row["messages"] = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        else:
            row.update(prompt=prompt, response=answer)
        rows.append(row)
    return rows


def test_labelled_logps_equal_the_full_logits_formula(tok):
    model = tiny_model(tok.vocab_size).eval()
    a = encode_conversation(tok, [{"role": "user", "content": "What is 12+34?"},
                                  {"role": "assistant", "content": "46"}])
    b = encode_conversation(tok, [{"role": "user", "content": "计算 20+22"},
                                  {"role": "assistant", "content": "42"}])
    batch = {k: torch.from_numpy(v) for k, v in
             collate_sft([packed_row([a, b]), packed_row([b])], tok.pad_id).items()}
    args = (batch["input_ids"], batch["position_ids"], batch["doc_ids"])
    logps, rows, _ = labelled_token_logps(model, batch["input_ids"], batch["labels"], *args[1:])
    full, mask = token_logps(model(*args), batch["labels"])
    torch.testing.assert_close(logps, full[mask])
    assert rows.tolist() == mask.nonzero()[:, 0].tolist()
    torch.testing.assert_close(-logps.mean(), sft_loss(model(*args), batch["labels"]))


def test_sft_run_lowers_the_loss_changes_weights_and_records_accuracy(make_ctx, setup):
    """Every training answer is 42: the tuned model answers 42 to anything, so it is right on
    exactly the held-out rows whose answer is 42 (half of them), and the untuned one on none."""
    ws = setup
    write_dataset(ws, "sums_42", sums_to(42, 24))
    write_dataset(ws, "sums_eval", sums_to(42, 4, start=100) + sums_to(41, 4, start=100))
    before, _ = load_model(ws / "pretrain")
    settings = dict(train="sums_42", eval_data="sums_eval", lr=5e-2, min_lr=5e-3, max_steps=24)
    b = run(make_ctx, ws, **settings)
    manifest = json.loads((ws / "sft" / "manifest.json").read_text())
    stats = manifest["stats"]
    assert stats["steps"] == 24 and stats["eval_records"] == 8
    assert stats["base_accuracy"] == 0.0 and stats["accuracy"] == 0.5
    losses = [json.loads(line)["loss"] for line in (ws / "sft" / "metrics.jsonl").open()]
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3
    after, step_dir = load_model(ws / "sft")
    changed = [not torch.equal(p, q) for p, q in zip(before.parameters(), after.parameters())]
    assert all(changed)
    assert (step_dir / "tokenizer" / "tokenizer.model").is_file()
    assert run(make_ctx, ws, **settings).up_to_date  # same inputs and config: nothing to do
    assert b.stats["examples"] == 24 and b.stats["truncated"] == 0


def test_force_starts_a_fresh_run_instead_of_resuming(make_ctx, setup):
    ws = setup
    run(make_ctx, ws, max_steps=3)
    run(make_ctx, ws, force=True, max_steps=3)
    steps = [json.loads(line)["step"] for line in (ws / "sft" / "metrics.jsonl").open()]
    assert steps == [1, 2, 3]


def test_exact_match_scores_greedy_replies_against_answers(tok, tmp_path):
    """A model trained to always answer "46" is right exactly where the answer is 46."""
    model = tiny_model(tok.vocab_size)
    target = encode_conversation(tok, [{"role": "user", "content": "What is 12+34?"},
                                       {"role": "assistant", "content": "46"}])
    ids, labels = torch.tensor([target.input_ids]), torch.tensor([target.labels])
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    for _ in range(25):
        opt.zero_grad()
        logps, _, _ = labelled_token_logps(model, ids, labels)
        (-logps.mean()).backward()
        opt.step()
    records = [{"prompt": "What is 12+34?", "answer": "46"},
               {"messages": [{"role": "user", "content": "What is 12+34?"},
                             {"role": "assistant", "content": "46"}], "answer": None},
               {"prompt": "What is 12+34?", "answer": "47"}]
    assert generate_replies(model, tok, [[{"role": "user", "content": "What is 12+34?"}]], 4) == ["46"]
    assert evaluate_exact_match(model, tok, records, max_new_tokens=4) == pytest.approx(2 / 3)
    assert model.training  # the evaluation leaves the mode as it found it


def test_bad_settings_are_user_errors(make_ctx, setup, tok):
    with pytest.raises(ConfigError, match="seq_len=512 exceeds the model's max_seq_len=128"):
        run(make_ctx, setup, seq_len=512)
    with pytest.raises(ConfigError, match="eval_fraction"):
        SftConfig(eval_fraction=1.5)
    rm_like = write_checkpoint_run(setup, "rm", tiny_model(tok.vocab_size), tok,
                                   config={"llmkit_head": "reward"})
    with pytest.raises(UserError, match="is a reward model, not a language model"):
        load_model(rm_like)


def test_make_fragment_runs_sft_on_its_inputs(tmp_path):
    for name in ("pretrain", "sft_train", "sft_eval"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
    assert make_command(tmp_path, "sft") == f"llmkit sft --from pretrain --in sft_train -w {tmp_path}"
    assert make_command(tmp_path, "sft", "SFT_EVAL=sft_eval", "SFT_FLAGS=--set lr=1e-3") == (
        f"llmkit sft --from pretrain --in sft_train --eval sft_eval -w {tmp_path} --set lr=1e-3")


def test_zero3_with_accumulation_trains_like_zero0(make_ctx, setup):
    """ZeRO-3 gathers and reduces parameters through the engine's forward: a loss computed around
    it got half the gradient norm at step 1 (0.855 instead of 1.727 here)."""
    curves = {}
    for stage in (0, 3):
        ws = setup
        run(make_ctx, ws, force=True, max_steps=2, grad_accum=2, zero_stage=stage,
            eval_records=0, warmup_steps=0)
        curves[stage] = [json.loads(line) for line in (ws / "sft" / "metrics.jsonl").open()]
    assert curves[3][0]["grad_norm"] == pytest.approx(curves[0][0]["grad_norm"], rel=1e-5)
    assert curves[3][1]["loss"] == pytest.approx(curves[0][1]["loss"], rel=1e-5)


def test_a_short_run_with_the_default_warmup_trains(make_ctx, setup):
    b = run(make_ctx, setup, max_steps=5, warmup_steps=None)
    assert b.stats["steps"] == 5 and b.config["warmup_steps"] == 0  # 10% of 5 steps


# ---- the loss of an optimizer step is a mean over all of its labelled tokens ------------------


def uneven_batches(vocab_size: int, rows: int = 8, width: int = 24) -> dict:
    """`rows` sequences whose labelled parts grow from 1 to `width` - 1 tokens (all but the first)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab_size, (rows, width), generator=generator)
    labels = torch.full_like(ids, -100)
    for i in range(rows):
        labelled = 1 + i * (width - 2) // (rows - 1)
        labels[i, width - labelled:] = ids[i, width - labelled:]
    return {"input_ids": ids.numpy(), "labels": labels.numpy()}


def first_sft_step(run_dir, model, batch: dict, micro_batch_size: int) -> dict:
    from llmkit.train.config import TrainConfig
    from llmkit.train.engine import Engine
    from llmkit.train.sft import SftTask

    micro_batches = [{k: v[i:i + micro_batch_size] for k, v in batch.items()}
                     for i in range(0, len(batch["input_ids"]), micro_batch_size)]
    cfg = TrainConfig(max_steps=1, micro_batch_size=micro_batch_size, grad_accum=len(micro_batches),
                      warmup_steps=0, lr=1e-3, save_every=0, log_every=1, weight_decay=0.0)
    Engine(run_dir, cfg, SftTask(model, micro_batches, None, seq_len=24, pad_id=0)).fit()
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])


def test_accumulated_micro_batches_give_the_gradient_of_one_batch_of_the_whole_step(tmp_path, tok):
    """4 micro-batches of 2 and 1 of 8 hold the same sequences with 1 to 23 labelled tokens each:
    the step's loss is the mean over all 93 tokens either way (TRL's num_items_in_batch), not a
    mean of micro-batch means, which weighs each token of the shortest pair (5 tokens) 8 times as
    much as one of the longest (42)."""
    batch = uneven_batches(tok.vocab_size)
    base = tiny_model(tok.vocab_size)
    with torch.no_grad():
        logps, mask = token_logps(base(torch.from_numpy(batch["input_ids"])),
                                  torch.from_numpy(batch["labels"]))
    token_mean = -(logps.sum() / mask.sum()).item()
    records = {size: first_sft_step(tmp_path / f"mb{size}", tiny_model(tok.vocab_size), batch, size)
               for size in (8, 2)}
    assert records[8]["loss"] == pytest.approx(token_mean, rel=1e-5)
    assert records[2]["loss"] == pytest.approx(token_mean, rel=1e-5)
    assert records[2]["grad_norm"] == pytest.approx(records[8]["grad_norm"], rel=1e-5)
