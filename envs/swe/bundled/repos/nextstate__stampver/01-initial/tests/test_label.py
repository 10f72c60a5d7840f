from stampver import __version__, short


def test_version_is_generated():
    assert __version__ and __version__[0].isdigit()


def test_short():
    assert short("stampver") == "sta"
