"""Every "contract §N" in the package, the tests and the guides names a section of
docs/contract.md, whose sections run 1, 2, ... in order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

ROOT = REPO
CONTRACT = ROOT / "docs" / "contract.md"
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
SECTIONS = 13
# "contract §4", "contract (§4)", "contract §4 and §9", "contract §§4, 9": the section
# numbers that follow the word "contract", across a line break too.
CITATION = re.compile(
    r"\bcontract\b[\s(]*((?:§+\s*\d+)(?:(?:\s*(?:,|;|and|or|to|–|-)\s*)§*\s*\d+)*)", re.I
)


def _sources() -> list[Path]:
    return sorted(
        [
            *(ROOT / "mnestoma").rglob("*.py"),
            *(ROOT / "tests").rglob("*.py"),
            *(ROOT / "docs").glob("*.md"),
            ROOT / "README.md",
        ]
    )


def _cited(text: str) -> list[int]:
    return [int(n) for match in CITATION.finditer(text) for n in re.findall(r"\d+", match[1])]


def _headings() -> list[str]:
    prose = FENCE.sub("", CONTRACT.read_text(encoding="utf-8"))
    return re.findall(r"^## (.+)$", prose, re.M)


def _sections() -> set[int]:
    return {int(m[1]) for h in _headings() if (m := re.match(r"(\d+)\. ", h))}


def test_the_citation_pattern_reads_every_form() -> None:
    assert _cited("see contract §4.") == [4]
    assert _cited("(contract §11): vet") == [11]
    assert _cited("the contract (§3) says") == [3]
    assert _cited("contract §4 and §9, contract §§2, 5") == [4, 9, 2, 5]
    assert _cited("contract\n    §10") == [10]
    assert _cited("the contract leaves open; §4 of nothing") == []


def test_the_sections_run_in_order() -> None:
    headings = _headings()
    assert headings, "docs/contract.md has no section"
    for number, heading in enumerate(headings, 1):
        assert re.match(rf"{number}\. \S", heading), f"section {number} reads {heading!r}"
    assert len(headings) == SECTIONS


def test_the_package_cites_the_contract() -> None:
    cited = [n for path in _sources() for n in _cited(path.read_text(encoding="utf-8"))]
    assert len(cited) >= 20  # the pattern still finds what the docstrings say


@pytest.mark.parametrize("path", _sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_citation_names_a_section(path: Path) -> None:
    sections = _sections()
    text = path.read_text(encoding="utf-8")
    missing = sorted({n for n in _cited(text) if n not in sections})
    assert not missing, f"{path.relative_to(ROOT)} cites contract §{missing}, not in contract.md"


def test_the_contract_page_cites_only_its_own_sections() -> None:
    prose = FENCE.sub("", CONTRACT.read_text(encoding="utf-8"))
    cited = {int(n) for n in re.findall(r"§\s*(\d+)", prose)}
    assert cited, "docs/contract.md refers to none of its sections"
    assert cited <= _sections(), sorted(cited - _sections())
