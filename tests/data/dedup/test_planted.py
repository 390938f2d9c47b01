from llmkit.data.dedup.planted import pair_scores, planted_corpus


def test_pair_scores_count_pairs_from_cluster_labels():
    truth = [0, 0, 0, 1, 2]
    assert pair_scores(truth, truth) == (1.0, 1.0)
    # found {0,1} and {3,4}: 1 of 2 found pairs is true, 1 of 3 true pairs found
    assert pair_scores(truth, [0, 0, 2, 3, 3]) == (0.5, 1 / 3)


def test_planted_corpus_truth_and_kinds():
    c = planted_corpus(30, unique=10, seed=1)
    assert len(c.texts) == len(c.truth) == len(c.kinds)
    for i, kind in enumerate(c.kinds):
        if kind == "exact":
            assert c.texts[i] == c.texts[c.source_of[i]] and c.truth[i] == c.truth[c.source_of[i]]
        elif kind == "edited":
            assert c.texts[i] != c.texts[c.source_of[i]] and c.truth[i] == c.truth[c.source_of[i]]
        elif kind == "lookalike":
            src = c.texts[c.source_of[i]]
            assert c.truth[i] != c.truth[c.source_of[i]] and c.texts[i][:40] == src[:40]
    assert c.kinds.count("unique") == 10
