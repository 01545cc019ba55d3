"""The name check of every passing (contract §5) remembers the plain names that passed it
lately, so that a name seen again costs a set lookup: the answers stay those of the full
check, and the memory stays bounded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mnestoma.core import validation
from mnestoma.core.validation import check_name
from mnestoma.errors import InvalidInput


@given(st.text(max_size=300))
def test_a_name_seen_again_gets_the_answer_of_its_first_check(name: str) -> None:
    try:
        first: str | None = check_name(name, "src_executor")
    except InvalidInput:
        first = None
    for _ in range(2):
        if first is None:
            with pytest.raises(InvalidInput):
                check_name(name, "src_executor")
        else:
            assert check_name(name, "src_executor") == first


class _Name(str):
    """A str subclass: its checks are never skipped (only plain str values are remembered)."""

    def strip(self, chars: str | None = None) -> str:
        return ""


def test_a_subclass_of_str_is_checked_every_time_even_with_a_remembered_value() -> None:
    assert check_name("agent.plan", "src_executor") == "agent.plan"
    with pytest.raises(InvalidInput, match="blank"):
        check_name(_Name("agent.plan"), "src_executor")


def test_the_remembered_names_stay_bounded() -> None:
    for i in range(validation._GOOD_NAMES_MAX * 2 + 10):
        check_name(f"tool-{i}", "dst_executor")
    assert 0 < len(validation._GOOD_NAMES) <= validation._GOOD_NAMES_MAX
    assert check_name("tool-0", "dst_executor") == "tool-0"
