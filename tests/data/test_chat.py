from functools import partial

import numpy as np
import pytest
import torch

from llmkit.data.chat import (IGNORE_INDEX, PAD_DOC, BatchStream, Example, collate_sft, conversation,
                              encode_conversation, encode_sft_rows, fixed_batches, one_per_prompt, pack,
                              packed_row, prompt_messages, reference_answer, sft_rows)
from llmkit.data.preferences import collate_pairs, encode_pair, encode_pairs
from llmkit.errors import UserError
from tests.train.posttrain_fixtures import tiny_model

CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 12+34?"},
        {"role": "assistant", "content": "46"},
        {"role": "user", "content": "Reverse: abcd"},
        {"role": "assistant", "content": "dcba"}]


def test_labels_cover_exactly_the_assistant_replies_and_their_end_tokens(tok):
    ex = encode_conversation(tok, CHAT)
    trained = [t for t in ex.labels if t != IGNORE_INDEX]
    replies = tok.encode("46") + [tok.end_of_turn_id] + tok.encode("dcba") + [tok.end_of_turn_id]
    assert trained == replies
    # every labelled position holds its own input token; all others are masked
    for i, (t, lab) in enumerate(zip(ex.input_ids, ex.labels)):
        assert lab in (IGNORE_INDEX, t)
    masked = [t for t, lab in zip(ex.input_ids, ex.labels) if lab == IGNORE_INDEX]
    for text in ("Be brief.", "What is 12+34?", "Reverse: abcd"):
        assert set(tok.encode(text)) <= set(masked)
    assert tok.role_ids["assistant"] in masked and tok.role_ids["user"] in masked


def test_one_bos_and_exactly_one_end_after_each_assistant_turn(tok):
    ex = encode_conversation(tok, CHAT)
    ids = ex.input_ids
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert tok.eos_id not in ids
    assert ids.count(tok.end_of_turn_id) == len(CHAT)  # every turn is closed once
    for pos in [i for i, t in enumerate(ids) if t == tok.role_ids["assistant"]]:
        end = ids.index(tok.end_of_turn_id, pos)
        assert ex.labels[end] == tok.end_of_turn_id  # the model learns to stop
        assert ids[end + 1:end + 2] != [tok.end_of_turn_id]
    # packing conversations never duplicates BOS inside one document either
    row = packed_row([ex, ex])
    assert row.input_ids.count(tok.bos_id) == 2 and row.input_ids[len(ex)] == tok.bos_id


def test_rows_become_conversations_and_prompts():
    pr = {"id": "a", "prompt": "Hi", "response": "Yo", "messages": None}
    assert conversation(pr) == [{"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": "Yo"}]
    msg = {"id": "b", "messages": CHAT, "answer": None}
    assert conversation(msg) == CHAT
    assert prompt_messages(msg) == CHAT[:4]
    assert reference_answer(msg) == "dcba" and reference_answer({**pr, "answer": "42"}) == "42"
    with pytest.raises(UserError, match="needs `messages` or `prompt` and `response`"):
        conversation({"id": "c", "prompt": "x"})


def test_long_conversations_are_cut_and_prompt_only_ones_dropped(tok):
    rows = [{"id": "1", "prompt": "What is 12+34?", "response": "46 " * 30},
            {"id": "2", "prompt": "What is 12+34? " * 10, "response": "46"},
            {"id": "3", "prompt": "Hi", "response": "46"}]
    examples, counts = encode_sft_rows(tok, rows, seq_len=24)
    assert counts == {"examples": 2, "truncated": 1, "dropped_too_long": 1}
    assert all(len(e) <= 24 for e in examples)


def test_packing_fits_every_example_once_within_seq_len():
    examples = [Example([1] * n, [1] * n) for n in (9, 7, 5, 4, 3, 3, 2, 1)]
    packs = pack(examples, seq_len=10)
    assert sorted(i for p in packs for i in p) == list(range(8))
    assert all(sum(len(examples[i]) for i in p) <= 10 for p in packs)
    assert len(packs) == 4  # 34 tokens need at least 4 sequences of 10


def test_packed_rows_restart_positions_and_number_documents(tok):
    a = encode_conversation(tok, CHAT[1:3])
    b = encode_conversation(tok, CHAT[3:])
    row = packed_row([a, b])
    assert row.position_ids == list(range(len(a))) + list(range(len(b)))
    assert row.doc_ids == [0] * len(a) + [1] * len(b)
    assert row.labels[len(a)] == IGNORE_INDEX  # no target across the document boundary
    rows = sft_rows([a, b, a], seq_len=2 * len(a) + 1, packing=True)
    assert len(rows) == 2 and sum(map(len, rows)) == 2 * len(a) + len(b)
    batch = collate_sft(rows, tok.pad_id)
    assert (batch["doc_ids"] == PAD_DOC).sum() == (batch["input_ids"] == tok.pad_id).sum()
    assert ((batch["labels"] == IGNORE_INDEX) | (batch["labels"] == batch["input_ids"])).all()


def test_packing_blocks_attention_between_conversations(tok):
    """Changing one packed conversation leaves the other's logits unchanged."""
    model = tiny_model(tok.vocab_size).eval()
    a = encode_conversation(tok, CHAT[1:3])
    b = encode_conversation(tok, CHAT[3:])
    b2 = encode_conversation(tok, [{"role": "user", "content": "计算 11+22"},
                                   {"role": "assistant", "content": "33"}])
    logits = []
    for first in (b, b2):
        batch = collate_sft([packed_row([first, a])], tok.pad_id)
        start = len(first)  # `a` follows the other conversation
        with torch.no_grad():
            out = model(*(torch.from_numpy(batch[k]) for k in ("input_ids", "position_ids",
                                                                "doc_ids")))
        logits.append(out[0, start:start + len(a)])
    alone = model(torch.tensor([a.input_ids]))[0]
    torch.testing.assert_close(logits[0], logits[1])
    torch.testing.assert_close(logits[0], alone, atol=1e-4, rtol=1e-4)


def test_batches_group_similar_lengths_and_serve_every_item_each_epoch():
    lengths = np.random.default_rng(0).integers(1, 60, 256).tolist()
    items = [Example([5] * n, [5] * n) for n in lengths]
    stream = BatchStream(items, partial(collate_sft, pad_id=0), micro_batch_size=8, seq_len=64,
                         seed=0)
    it = iter(stream)
    batches = [next(it) for _ in range(len(stream.sampler))]
    assert sum(len(b["input_ids"]) for b in batches) == 256
    padding = sum(int((b["labels"] == IGNORE_INDEX).sum()) for b in batches)
    assert padding < 0.1 * sum(lengths)  # random batches of 8 would pad ~30%


def test_preference_pairs_share_the_prompt_and_label_only_replies(tok):
    pair = encode_pair(tok, {"prompt": "What is 12+34?", "chosen": "46", "rejected": "56"}, 64)
    for side, reply in ((pair.chosen, "46"), (pair.rejected, "56")):
        assert [t for t in side.labels if t != IGNORE_INDEX] == tok.encode(reply) + [tok.end_of_turn_id]
    n_prompt = len(pair.chosen) - len(tok.encode("46")) - 1
    assert pair.chosen.input_ids[:n_prompt] == pair.rejected.input_ids[:n_prompt]
    batch = collate_pairs([pair, pair], tok.pad_id)
    assert batch["input_ids"].shape[0] == 4
    assert batch["attention_mask"][0].sum() == len(pair.chosen)
    assert (batch["input_ids"][2] == batch["input_ids"][3]).all()  # rejected rows come second
    assert len(fixed_batches([pair] * 5, partial(collate_pairs, pad_id=tok.pad_id), 2)) == 3
    pair.ref_logps = (-1.0, -2.0)
    assert collate_pairs([pair, pair], tok.pad_id)["ref_logps"].tolist() == [-1, -1, -2, -2]


def test_stream_replays_the_same_batches_after_resume():
    items = [Example([i] * (1 + i % 7), [i] * (1 + i % 7)) for i in range(40)]
    collate = partial(collate_sft, pad_id=0)

    def ids(batch):
        return sorted(set(batch["input_ids"][:, 0].tolist()))

    stream = BatchStream(items, collate, micro_batch_size=4, seq_len=8, seed=3)
    it = iter(stream)
    [next(it) for _ in range(13)]  # past the first epoch
    state = stream.state_dict()
    rest = [ids(next(it)) for _ in range(6)]
    resumed = BatchStream(items, collate, micro_batch_size=4, seq_len=8, seed=3)
    resumed.load_state_dict(state)
    it2 = iter(resumed)
    assert [ids(next(it2)) for _ in range(6)] == rest


def test_pairs_with_the_same_tokens_on_both_sides_are_left_out_counted_and_warned_of(tok, capsys):
    rows = [{"prompt": "What is 12+34?", "chosen": "46", "rejected": "46"},
            {"prompt": "What is 1+1?", "chosen": "2", "rejected": "3"},
            {"prompt": "Say it", "chosen": "abcdefgh", "rejected": "abcdefgX"}]
    cut = len(encode_pair(tok, rows[2], 64).chosen) - 3  # the replies differ only past seq_len
    pairs, counts = encode_pairs(tok, rows, cut)
    assert [p.chosen.input_ids != p.rejected.input_ids for p in pairs] == [True]
    assert counts == {"pairs": 1, "dropped_too_long": 0, "dropped_identical": 2}
    assert "2 of 3 preference pairs have the same chosen and rejected reply" in capsys.readouterr().err


def test_one_row_per_prompt_keeps_the_best_pair_of_a_ranked_list():
    ranked = [{"prompt": "1+1", "chosen": "2", "rejected": "3"},
              {"prompt": "1+1", "chosen": "2", "rejected": "9"},
              {"prompt": "1+1", "chosen": "3", "rejected": "9"},  # a lesser reply as `chosen`
              {"prompt": "2+2", "chosen": "4", "rejected": "5"}]
    assert [reference_answer(r) for r in one_per_prompt(ranked)] == ["2", "4"]


def test_the_commonest_reason_a_record_lacked_its_kinds_shape_is_followed_by_the_shapes_read():
    from collections import Counter

    from llmkit.data.chat import shape_hint

    reasons = Counter({"invalid_utf8": 9, "missing_prompt": 5, "no_assistant_turn": 2})
    assert shape_hint("sft", reasons) == {"missing_prompt": "missing_prompt — --kind sft reads `messages` (a list "
                                          "of {role, content} with an assistant turn), or `prompt` (or "
                                          "`instruction`, + `input`) with `response` (or `output`)"}
    assert shape_hint("text", reasons) == {} and shape_hint("sft", Counter({"invalid_utf8": 1})) == {}
