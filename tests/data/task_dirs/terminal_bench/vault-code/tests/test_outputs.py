# hidden-test-marker-b5f2
from pathlib import Path

CODE = "kestrel-4e1d-vault-91c7"


def test_the_code_is_written():
    assert Path("/app/code.txt").read_text().strip() == CODE


def test_the_code_has_the_vaults_format():
    code = Path("/app/code.txt").read_text().strip()
    assert len(code) == len(CODE) and code.split("-")[2] == "vault"
