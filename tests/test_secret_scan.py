"""The commit scan's detection rules on real git diffs (real git, no Docker)."""

from __future__ import annotations

import base64
import urllib.parse

import pytest
from conftest import git, make_repo

from orchestrator.runner.secret_scan import scan_commits, scan_diff
from orchestrator.sanitize import Sanitizer

KEY = "sk-ant-api03-Zq9xY8wV7uT6sR5qP4oN3mL2kJ1iH0gF"
OAUTH = "oauth/token+with=odd&chars-0123456789"
SECRETS = [("ANTHROPIC_API_KEY", KEY), ("CLAUDE_CODE_OAUTH_TOKEN", OAUTH)]


def _commit(tmp_path, files: dict[str, str]):
    repo = make_repo(tmp_path / "ws", {"README.md": "# base\n"})
    base = git(repo, "rev-parse", "HEAD")
    for name, text in files.items():
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "agent work")
    return repo, base, git(repo, "rev-parse", "HEAD")


@pytest.mark.parametrize("prefix", ["", "a", "ab", "abc"])
def test_base64_of_a_key_is_found_at_any_alignment_and_in_either_alphabet(tmp_path, prefix):
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        blob = encode(prefix.encode() + KEY.encode() + b"tail").decode()
        (finding,) = scan_diff(f"+++ b/x.txt\n@@ -0,0 +7 @@\n+data: {blob}\n", SECRETS)
        assert (finding.path, finding.line, finding.what) == ("x.txt", 7, "the run's ANTHROPIC_API_KEY (base64)")


def test_each_encoding_and_token_shape_is_named_with_its_file_and_line_never_its_value(tmp_path):
    repo, base, head = _commit(
        tmp_path,
        {
            "plain.txt": f"ok\nkey = {KEY}\n",
            "hex.txt": f"{OAUTH.encode().hex()}\n",
            "pct.txt": f"u={urllib.parse.quote(OAUTH, safe='')}\n",
            "gh.txt": "\n\nGITHUB_TOKEN=github_pat_" + "A1b2C3d4" * 6 + "\n",
            "aws.txt": "aws_access_key_id = AKIAABCDEFGHIJKLMNOP\n",
            "clean.txt": "nothing to see\n",
        },
    )
    found = {f.path: (f.line, f.what) for f in scan_commits(repo, base, head, SECRETS)}
    assert found == {
        "plain.txt": (2, "the run's ANTHROPIC_API_KEY"),
        "hex.txt": (1, "the run's CLAUDE_CODE_OAUTH_TOKEN (hex)"),
        "pct.txt": (1, "the run's CLAUDE_CODE_OAUTH_TOKEN (percent-encoded)"),
        "gh.txt": (3, "GitHub fine-grained token"),
        "aws.txt": (1, "AWS access key id"),
    }
    assert all(KEY not in f.describe() and OAUTH not in f.describe() for f in scan_commits(repo, base, head, SECRETS))


def test_removed_lines_and_an_unchanged_branch_are_not_findings(tmp_path):
    repo = make_repo(tmp_path / "ws", {"old.txt": f"{KEY}\n"})
    base = git(repo, "rev-parse", "HEAD")
    assert scan_commits(repo, base, base, SECRETS) == []
    (repo / "old.txt").write_text("cleaned\n")
    git(repo, "commit", "-q", "-am", "remove the key")
    assert scan_commits(repo, base, git(repo, "rev-parse", "HEAD"), SECRETS) == []


def test_the_sanitizer_removes_encoded_forms_too():
    s = Sanitizer([KEY])
    for text in (KEY.encode().hex(), KEY.encode().hex().upper(), base64.b64encode(b"xy" + KEY.encode()).decode()):
        assert KEY.encode().hex() not in s.scrub_text(text) and "[REDACTED]" in s.scrub_text(text)
