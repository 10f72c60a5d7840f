import subprocess


def git(*args):
    return subprocess.run(["git", "-C", "/repo", *args], capture_output=True, text=True, check=True).stdout.strip()


def test_on_feature_branch():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "feature/greeting"


def test_greeting_committed_on_the_branch_only():
    assert git("show", "feature/greeting:greeting.txt") == "hello, world"
    assert git("rev-list", "--count", "main") == "1"
    assert "greeting.txt" not in git("ls-tree", "--name-only", "main")
