"""README.md is for users: short, every link and repository path it names exists, and no citation of a
design document the repository does not have (the docs it links to are the repository's own)."""

from __future__ import annotations

import re
import subprocess

from conftest import REPO

README = REPO / "README.md"
MAX_LINES = 300
# Top-level entries a backticked path may start with: anything else in backticks is not a path here
# (`/metrics`, `/etc/...`, config keys, commands).
ROOTS = {p.name for p in REPO.iterdir() if not p.name.startswith(".")}


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_the_two_commands_come_first():
    text = README.read_text()
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in first_block.strip().splitlines()] == [["make", "demo"], ["make", "test"]]


def _relative_links(text: str) -> list[str]:
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    return [link for link in links if not re.match(r"[a-z]+://|#|mailto:", link)]


def test_every_relative_link_resolves():
    for doc in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for link in _relative_links(doc.read_text()):
            target = (doc.parent / link.split("#", 1)[0]).resolve()
            assert target.exists(), f"{doc.relative_to(REPO)} links to {link}, which does not exist"


def _named_paths(text: str) -> set[str]:
    paths = set()
    for code in re.findall(r"`([^`\n]+)`", text):
        for word in code.split():
            word = word.strip("(),;:'\"")
            head = word.split("/", 1)[0]
            if head in ROOTS and ("/" in word or "." in word):
                paths.add(word)
    return paths


def test_every_repository_path_the_readme_names_exists():
    named = _named_paths(README.read_text())
    assert "deploy/helm/llm-vitals/" in named  # the check reads what it should
    for path in sorted(named):
        if any(ch in path for ch in "*?["):
            assert list(REPO.glob(path)), f"README names {path}: nothing matches"
        else:
            assert (REPO / path).exists(), f"README names {path}, which does not exist"


def test_the_path_check_catches_a_missing_file():
    assert _named_paths("see `docs/nowhere.md` and `/metrics`") == {"docs/nowhere.md"}
    assert not (REPO / "docs" / "nowhere.md").exists()


def test_no_file_cites_a_design_document_by_section():
    """"DESIGN §N" pointed at a document that is not in the repository."""
    found = subprocess.run(["git", "grep", "-n", "DESIGN §", "--", ".", ":!tests/test_readme.py"], cwd=REPO,
                           capture_output=True, text=True)
    assert found.stdout == "", found.stdout
