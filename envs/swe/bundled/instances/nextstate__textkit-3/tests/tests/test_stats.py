from textkit import top_words, word_frequencies


def test_counts_words():
    assert word_frequencies("a b a") == {"a": 2, "b": 1}


def test_top_words_orders_by_count_then_name():
    assert top_words("pear apple pear fig apple kiwi", 3) == ["apple", "pear", "fig"]


def test_top_words_with_fewer_words_than_n():
    assert top_words("one", 5) == ["one"]


def test_case_and_punctuation_are_ignored():
    assert word_frequencies("The cat; the CAT.") == {"the": 2, "cat": 2}


def test_top_words_normalizes_words():
    assert top_words("Go, go, GO! stop.", 1) == ["go"]
    assert word_frequencies("it's it's") == {"it's": 2}
