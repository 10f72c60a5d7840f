# hidden-test-marker-b5f2
from pathlib import Path

CODE = "kestrel-4e1d-vault-91c7"


def test_the_code_is_written():
    assert Path("/app/code.txt").read_text().strip() == CODE
