from textkit import slugify


def test_basic():
    assert slugify("Hello World") == "hello-world"


def test_accents_are_dropped():
    assert slugify("Crème Brûlée") == "creme-brulee"


def test_custom_separator():
    assert slugify("Hello World", sep="_") == "hello_world"


def test_digits_are_kept():
    assert slugify("Top 10 lists") == "top-10-lists"


def test_runs_of_punctuation_and_spaces_collapse():
    assert slugify("  Hello,   World!  ") == "hello-world"


def test_existing_separators_collapse():
    assert slugify("a--b") == "a-b"
    assert slugify("a - b", sep="_") == "a_b"
