"""Every relative link and image in the README and docs/ points at a file in the repository.

Run on a fresh clone (as CI does), this also catches a linked file that was never committed.
"""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
#: [text](target) and ![alt](target); the target up to whitespace or ')'.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def relative_targets(document: Path) -> list[str]:
    targets = []
    prose = re.sub(r"`[^`]*`", "", document.read_text())  # code spans hold maths such as M_[a, b](r_d)
    for target in LINK.findall(prose):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # external address or an anchor in the same page
        targets.append(target.split("#", 1)[0])
    return targets


def test_the_pattern_finds_links_and_images(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "see [the report](a/report.md) and ![curves](a/curves.png#top), [web](https://x.org), [here](#top), `M_[a, b](r_d)`"
    )
    assert relative_targets(page) == ["a/report.md", "a/curves.png"]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(REPO)))
def test_relative_links_point_at_files_in_the_repository(document):
    missing = [target for target in relative_targets(document) if not (document.parent / target).exists()]
    assert missing == [], f"{document.relative_to(REPO)} links to files that are not in the repository: {missing}"
