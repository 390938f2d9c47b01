import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmkit.data.loader import LengthBucketSampler, TokenLoader, mixture
from llmkit.errors import ConfigError

BLOCK = 20000  # source i's stream holds the values i*BLOCK, i*BLOCK+1, ... (position + origin)


def write_tokens(root: Path, shards: list[list[tuple[str, int]]], split="train", dtype="uint16",
                 first=0) -> Path:
    """A token artifact whose shards hold documents (source, n_tokens) of `split`; each
    source's stream counts up from first + its BLOCK, so a token tells its source and its
    position in the stream. The other split gets one document per shard, which must be ignored."""
    names = sorted({s for shard in shards for s, _ in shard})
    next_value = {s: first + names.index(s) * BLOCK for s in names}
    other = "val" if split == "train" else "train"
    for d in ("train", "val", "index"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for k, docs in enumerate(shards):
        tokens, rows, offset = [], [], 0
        for j, (source, n) in enumerate(docs):
            v = next_value[source]
            tokens += range(v, v + n)
            next_value[source] += n
            rows.append({"id": f"{k}-{j}", "source": source, "split": split,
                         "offset": offset, "length": n})
            offset += n
        rows.insert(1, {"id": f"{k}-x", "source": "elsewhere", "split": other,
                        "offset": 0, "length": 3})
        np.array(tokens, dtype).tofile(root / split / f"shard-{k:05d}.bin")
        np.array([65000] * 3, dtype).tofile(root / other / f"shard-{k:05d}.bin")
        table = pa.Table.from_pylist(rows).cast(pa.schema([
            ("id", pa.string()), ("source", pa.string()), ("split", pa.string()),
            ("offset", pa.int64()), ("length", pa.int64())]))
        table = table.set_column(2, "split", table.column("split").dictionary_encode())
        pq.write_table(table, root / "index" / f"shard-{k:05d}.parquet")
    vocab = int(np.iinfo(dtype).max)
    (root / "manifest.json").write_text(json.dumps({"stats": {"dtype": dtype, "vocab_size": vocab}}))
    return root


def sources_of(batch) -> list[int]:
    return (batch["input_ids"][:, 0] // BLOCK).tolist()


@pytest.fixture
def three_sources(tmp_path):
    # a: 1,000 tokens, b: 10,000, c: 20,000, interleaved over two shards
    shard0 = [("a", 500), ("c", 10000), ("b", 5000)]
    shard1 = [("b", 5000), ("c", 10000), ("a", 500)]
    return write_tokens(tmp_path, [shard0, shard1])


def test_rows_are_stream_windows_with_next_token_labels(three_sources):
    loader = TokenLoader(three_sources, seq_len=16, micro_batch_size=8)
    for _ in range(20):
        batch = next(loader)
        x, y = batch["input_ids"], batch["labels"]
        assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == np.int64
        assert (y[:, :-1] == x[:, 1:]).all()
        # consecutive values of one source's stream, starting on a window boundary (those
        # crossing documents and shards included)
        assert (np.diff(np.concatenate([x, y[:, -1:]], axis=1), axis=1) == 1).all()
        assert ((x[:, 0] % BLOCK) % 16 == 0).all()


def test_uint32_shards_give_ids_above_uint16(tmp_path):
    """A vocabulary over 65,535 tokens (Llama 3, Qwen) is stored as uint32 shards."""
    root = write_tokens(tmp_path, [[("a", 500), ("b", 300)], [("a", 201)]], dtype="uint32",
                        first=100_000)
    loader = TokenLoader(root, seq_len=16, micro_batch_size=8, weights={"a": 1, "b": 1})
    rows = [next(loader) for _ in range(10)]
    x = np.concatenate([b["input_ids"] for b in rows])
    y = np.concatenate([b["labels"] for b in rows])
    assert loader.vocab_size == 2**32 - 1 and x.min() >= 100_000
    assert (np.diff(np.concatenate([x, y[:, -1:]], axis=1), axis=1) == 1).all()
    assert sorted(set((x[:, 0] - 100_000) // BLOCK)) == [0, 1]
    assert set(x[:, 0] % 16) == {100_000 % 16, (100_000 + BLOCK) % 16}  # window starts
    assert {int(v) for v in x[:, 0]} <= set(range(100_000, 100_701 - 16, 16)) | set(
        range(100_000 + BLOCK, 100_000 + BLOCK + 300 - 16, 16))


def test_mixture_matches_the_temperature_formula_within_one_sample_at_every_prefix(three_sources):
    """The loader's promise: after any g samples, each source gave p(source)·g of them ± 1."""
    loader = TokenLoader(three_sources, seq_len=4, micro_batch_size=1000, temperature=0.7)
    picks = np.concatenate([sources_of(next(loader)) for _ in range(100)])  # 100,000 samples
    expected = mixture({"a": 1000, "b": 10000, "c": 20000}, 0.7)
    raw = {s: n ** 0.7 for s, n in {"a": 1000, "b": 10000, "c": 20000}.items()}
    g = np.arange(1, len(picks) + 1)
    for i, s in enumerate("abc"):
        assert expected[s] == pytest.approx(raw[s] / sum(raw.values()))
        error = np.abs(np.cumsum(picks == i) - expected[s] * g)
        assert error.max() <= 1.0, (s, int(error.argmax()) + 1, error.max())


def test_explicit_weights_override_the_temperature(three_sources):
    loader = TokenLoader(three_sources, seq_len=4, micro_batch_size=400,
                         weights={"a": 1, "c": 3})
    counts = Counter(sources_of(next(loader)))
    assert counts == {0: 100, 2: 300}
    with pytest.raises(ConfigError, match="unknown sources"):
        TokenLoader(three_sources, seq_len=4, micro_batch_size=1, weights={"d": 1})


def test_restored_state_reproduces_the_following_batches(three_sources):
    run = TokenLoader(three_sources, seq_len=32, micro_batch_size=4, seed=3)
    for _ in range(57):
        next(run)
    state = json.loads(json.dumps(run.state_dict()))  # survives a checkpoint file
    expected = [next(run) for _ in range(30)]
    resumed = TokenLoader(three_sources, seq_len=32, micro_batch_size=4, seed=3)
    resumed.load_state_dict(state)
    for want in expected:
        got = next(resumed)
        assert (got["input_ids"] == want["input_ids"]).all()


def test_a_mixture_stage_changes_the_shares_from_its_first_sample_on(three_sources):
    """Before the stage the batches are those of a run without it; from its first sample every
    prefix of the stage matches the stage's weights within one sample; each source continues its
    own stream where it stopped (no window repeated, none skipped)."""
    plain = TokenLoader(three_sources, seq_len=4, micro_batch_size=100, weights={"b": 1, "c": 1})
    staged = TokenLoader(three_sources, seq_len=4, micro_batch_size=100, weights={"b": 1, "c": 1},
                         stages=[(300, {"a": 1, "c": 3})])
    before = [next(staged) for _ in range(3)]
    assert all((a["input_ids"] == next(plain)["input_ids"]).all() for a in before)
    after = np.concatenate([next(staged)["input_ids"][:, 0] for _ in range(8)])
    picks = after // BLOCK
    g = np.arange(1, len(picks) + 1)
    for i, share in ((0, 0.25), (1, 0.0), (2, 0.75)):
        assert np.abs(np.cumsum(picks == i) - share * g).max() <= 1.0, i
    c_windows = np.concatenate([b["input_ids"][:, 0] for b in before])
    c_windows = np.concatenate([c_windows[c_windows // BLOCK == 2], after[picks == 2]])
    assert len(set(c_windows.tolist())) == len(c_windows)  # c's permutation goes on, no repeat
    assert staged.state_dict()["counts"] == {"a": 200, "b": 150, "c": 750}


def test_a_run_resumed_inside_a_stage_continues_it_exactly(three_sources):
    def loader():
        return TokenLoader(three_sources, seq_len=8, micro_batch_size=10, seed=1,
                           stages=[(55, {"a": 2, "b": 1}), (123, {"c": 1})])
    run = loader()
    for _ in range(9):  # sample 90: inside the first stage
        next(run)
    state = json.loads(json.dumps(run.state_dict()))
    expected = [next(run)["input_ids"] for _ in range(10)]
    resumed = loader()
    resumed.load_state_dict(state)
    assert all((next(resumed)["input_ids"] == want).all() for want in expected)
    assert (np.concatenate(expected[-6:])[:, 0] // BLOCK == 2).all()  # samples 130-189: c only


def test_mixture_stages_must_start_later_and_name_known_sources(three_sources):
    with pytest.raises(ConfigError, match="increasing"):
        TokenLoader(three_sources, seq_len=4, micro_batch_size=1, stages=[(20, {"a": 1}), (20, {"b": 1})])
    with pytest.raises(ConfigError, match="unknown sources"):
        TokenLoader(three_sources, seq_len=4, micro_batch_size=1, stages=[(20, {"d": 1})])


def test_ranks_split_every_epoch_without_overlap(tmp_path):
    root = write_tokens(tmp_path, [[("a", 3000)], [("a", 1801)]])  # 4800 // 16 = 300 samples
    starts = []
    world, micro = 3, 4
    ranks = [TokenLoader(root, seq_len=16, micro_batch_size=micro, rank=r, world_size=world)
             for r in range(world)]
    single = TokenLoader(root, seq_len=16, micro_batch_size=world * micro)
    for _ in range(300 // (world * micro)):  # one epoch
        step = [next(r)["input_ids"][:, 0].tolist() for r in ranks]
        assert [s for part in step for s in part] == next(single)["input_ids"][:, 0].tolist()
        starts += [s for part in step for s in part]
    assert sorted(starts) == list(range(0, 4800, 16))


def test_epochs_reshuffle_deterministically(tmp_path):
    root = write_tokens(tmp_path, [[("a", 801)]])  # 50 samples

    def epochs(seed):
        loader = TokenLoader(root, seq_len=16, micro_batch_size=50, seed=seed)
        return [next(loader)["input_ids"][:, 0].tolist() for _ in range(3)]

    first = epochs(seed=0)
    assert all(sorted(e) == list(range(0, 800, 16)) for e in first)
    assert first[0] != first[1] != first[2]
    assert epochs(seed=0) == first and epochs(seed=1) != first


def test_eval_batches_are_finite_deterministic_and_cover_the_split(tmp_path):
    root = write_tokens(tmp_path, [[("a", 100), ("b", 60)]], split="val")
    loader = TokenLoader(root, "val", seq_len=10, micro_batch_size=4)  # 15 windows
    batches = list(loader.eval_batches())
    assert len(batches) == 4  # 16 rows: the last global batch wraps to stay full
    firsts = [int(v) for b in batches for v in b["input_ids"][:, 0]]
    assert firsts[:10] == list(range(0, 100, 10)) and firsts[10:15] == list(
        range(BLOCK, BLOCK + 50, 10))
    assert firsts[15] == 0
    assert [b["input_ids"].tolist() for b in loader.eval_batches()] == [
        b["input_ids"].tolist() for b in batches]
    assert len(list(loader.eval_batches(2))) == 2
    r1 = TokenLoader(root, "val", seq_len=10, micro_batch_size=2, rank=1, world_size=2)
    assert [int(v) for v in next(r1.eval_batches())["input_ids"][:, 0]] == [20, 30]


# -- LengthBucketSampler --------------------------------------------------------------------

LENGTHS = np.random.default_rng(0).integers(5, 300, size=1000).tolist() + [900]


def test_buckets_keep_padded_tokens_within_the_budget_and_cover_the_epoch():
    s = LengthBucketSampler(LENGTHS, max_tokens=1024, seed=0)
    epoch = [next(s) for _ in range(len(s))]
    for batch in epoch:
        padded = max(LENGTHS[i] for i in batch) * len(batch)
        assert padded <= 1024
    assert sorted(i for b in epoch for i in b) == list(range(len(LENGTHS)))
    fill = sum(LENGTHS) / sum(max(LENGTHS[i] for i in b) * len(b) for b in epoch)
    assert fill > 0.9  # lengths within a batch are close: little padding


def test_bucket_ranks_are_disjoint_and_resume_exactly():
    ranks = [LengthBucketSampler(LENGTHS, 1024, seed=1, rank=r, world_size=2) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    taken = [i for r in ranks for _ in range(len(r)) for i in next(r)]
    assert len(taken) == len(set(taken))
    run = LengthBucketSampler(LENGTHS, 1024, seed=1)
    for _ in range(len(run) + 5):  # into the second epoch
        next(run)
    state = run.state_dict()
    expected = [next(run) for _ in range(10)]
    resumed = LengthBucketSampler(LENGTHS, 1024, seed=1)
    resumed.load_state_dict(state)
    assert [next(resumed) for _ in range(10)] == expected

def test_bucket_epochs_reshuffle_and_depend_on_the_seed():
    def first_epochs(seed):
        s = LengthBucketSampler(LENGTHS, 1024, seed=seed)
        e0 = [next(s) for _ in range(len(s))]
        e1 = [next(s)]
        assert s.epoch == 1
        return e0, e1 + [next(s) for _ in range(len(s) - 1)]

    e0, e1 = first_epochs(1)
    assert e0 != e1 and sorted(i for b in e1 for i in b) == list(range(len(LENGTHS)))
    assert first_epochs(1) == (e0, e1) and first_epochs(2)[0] != e0
