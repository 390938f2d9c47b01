import numpy as np

from llmkit.data.dedup import unionfind


def sets(*docs):
    values = np.concatenate([np.array(list(d), np.uint32) for d in docs])
    offsets = np.r_[0, np.cumsum([len(d) for d in docs])].astype(np.int64)
    return values, offsets


def test_bucket_groups_lists_documents_sharing_a_key_in_order():
    members, offsets = unionfind.bucket_groups(np.array([7, 3, 7, 5, 3, 7], np.uint64),
                                               first_index=10)
    groups = [members[offsets[g]:offsets[g + 1]].tolist() for g in range(len(offsets) - 1)]
    assert sorted(groups) == [[10, 12, 15], [11, 14]]


def test_a_lookalike_first_in_a_bucket_does_not_keep_duplicates_apart():
    lookalike, original, copy = set(range(0, 10)), set(range(5, 25)), set(range(6, 25))
    values, offsets = sets(lookalike, original, copy)
    parent = unionfind.new_parents(3)
    verified, accepted = unionfind.cluster_buckets(
        parent, np.array([0, 1, 2]), np.array([0, 3]), unionfind.JACCARD, values, offsets, 0.5)
    assert unionfind.roots(parent).tolist() == [0, 1, 1]
    assert (verified, accepted) == (3, 1)


def test_pairs_already_in_one_cluster_are_not_verified_again():
    same = set(range(20))
    values, offsets = sets(same, same, same, same)
    parent = unionfind.new_parents(4)
    members, bucket_offsets = np.array([0, 1, 2, 3, 0, 1, 2, 3]), np.array([0, 4, 8])
    verified, accepted = unionfind.cluster_buckets(parent, members, bucket_offsets,
                                                   unionfind.JACCARD, values, offsets, 0.9)
    assert (verified, accepted) == (3, 3)  # k copies cost k − 1 checks, in any number of bands
    assert unionfind.roots(parent).tolist() == [0, 0, 0, 0]


def test_hamming_and_equal_checks():
    fps = np.array([0b1111, 0b0111, 0b0000], np.uint64)
    one_each = np.arange(4, dtype=np.int64)
    parent = unionfind.new_parents(3)
    unionfind.cluster_buckets(parent, np.array([0, 1, 2]), np.array([0, 3]), unionfind.HAMMING,
                              fps, one_each, 1)
    assert unionfind.roots(parent).tolist() == [0, 0, 2]
    parent = unionfind.new_parents(3)
    unionfind.cluster_buckets(parent, np.array([0, 1, 2]), np.array([0, 3]), unionfind.EQUAL,
                              np.array([5, 6, 5], np.uint64), one_each, 0)
    assert unionfind.roots(parent).tolist() == [0, 1, 0]


def test_root_is_the_smallest_index_whatever_the_union_order():
    parent = unionfind.new_parents(6)
    for x, y in [(5, 4), (4, 3), (2, 5), (1, 0)]:
        unionfind.union(parent, x, y)
    assert unionfind.roots(parent).tolist() == [0, 0, 2, 2, 2, 2]


def test_set_jaccard_counts_distinct_values():
    keys, seen = np.empty(64, np.uint64), np.empty(64, np.uint8)

    def jaccard(a, b):
        return unionfind.set_jaccard(np.array(a, np.uint32), np.array(b, np.uint32), keys, seen)

    assert jaccard([1, 2, 3], [2, 3, 4]) == 0.5
    assert jaccard([3, 1, 2, 2, 2], [4, 3, 3, 2]) == 0.5  # repeats count once
    assert jaccard([0, 64, 128], [0, 128]) == 2 / 3  # values colliding in the table
    assert jaccard([], []) == 1.0 and jaccard([5], []) == 0.0


def test_gather_ragged_reads_only_the_slices_asked_for():
    stored = np.arange(10, dtype=np.uint32)
    out = unionfind.gather_ragged(stored, np.array([1, 6, 9]), np.array([2, 0, 1]))
    assert out.tolist() == [1, 2, 9]
