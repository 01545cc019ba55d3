"""The README and the guides are reference: they say what is, not when it was seen. A
figure's day, a session or "today" belongs to the benchmarks' history
(benchmarks/results/history.md) or the changelog, and the suite's time is stated once, in
the README, the guides that repeat it giving the same figure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
# Words of a diary: they date a sentence, or tie a figure to one day's machine.
DIARY = re.compile(
    r"\b(?:today|yesterday|this (?:session|morning|afternoon|week)|on (?:a|one|the same)"
    r" (?:slower |slow |quiet |busy |later |earlier )?day\b|of one day|(?:a|one) (?:slower"
    r"|slow|quiet|busy) day|on this main|measured (?:on this|now)|as measured now"
    r"|at the time of writing)",
    re.I,
)
# "takes 6 to 8 minutes on two idle cores": the whole suite's time.
SUITE_TIME = re.compile(r"\b(\d+) to (\d+) minutes on two idle cores")


def _joined(page: Path) -> str:
    return " ".join(page.read_text(encoding="utf-8").split())


def _name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_no_guide_speaks_as_a_diary(page: Path) -> None:
    text = _joined(page)
    found = [text[max(0, m.start() - 40) : m.end() + 20] for m in DIARY.finditer(text)]
    assert not found, (
        f"{_name(page)} dates its prose; say what is, and move the day's figures to "
        f"benchmarks/results/history.md: {found}"
    )


def test_the_diary_words_are_found() -> None:
    for said in (
        "measured today",
        "on a slower day the ratio",
        "this session",
        "the suite's time as measured on this main",
        "over fifteen runs of one day",
        "a quiet day's",
    ):
        assert DIARY.search(said), said
    for plain in ("one day, `LOCK_TIMEOUT_MAX_S`", "a day", "days since", "the session's store"):
        assert not DIARY.search(plain), plain


def test_the_readme_states_the_suites_time_once() -> None:
    said = SUITE_TIME.findall(_joined(README))
    assert len(said) == 1, f"README.md states the whole suite's time {len(said)} times: {said}"
    for page in PAGES:
        others = set(SUITE_TIME.findall(_joined(page)))
        assert others <= set(said), f"{_name(page)} gives the suite another time: {others}"
