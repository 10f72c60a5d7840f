from stampver import __version__, label, short


def test_version_is_generated():
    assert __version__ and __version__[0].isdigit()


def test_short():
    assert short("stampver") == "sta"


def test_label_separates_name_and_version():
    assert label("stampver") == f"stampver {__version__}"
