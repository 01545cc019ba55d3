"""What the README and the guides say of the code is what the code is: the contract's
`Settings(...)` signature and its list of public names, the number of the contract's
sections, the files the maintainers' guide names."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from conftest import REPO

import mnestoma
from mnestoma import Settings

CONTRACT = REPO / "docs" / "contract.md"
MAINTAINERS = REPO / "docs" / "maintainers.md"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
# "sections 1–13", "sections 1-13", "run 1 to 13": how a guide says how many there are.
SECTION_COUNT = re.compile(r"\b(?:sections|run)\s+1\s*(?:–|-|to)\s*(\d+)\b")
# A path of the checkout in backquotes: `mnestoma/core/rules.py`, `tests/store/test_aio.py`,
# `docs/api/`, `migrations/versions/`.
CHECKOUT_PATH = re.compile(
    r"`((?:mnestoma|tests|docs|migrations|benchmarks)/[\w./-]*|[\w-]+\.(?:md|toml|ini))`"
)


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _contract_sections() -> int:
    prose = FENCE.sub("", _text(CONTRACT))
    return len(re.findall(r"^## \d+\. ", prose, re.M))


def _settings_signature() -> str:
    """The arguments of the ``Settings(...)`` the contract's §5 writes out."""
    found = re.search(r"\*\*`Settings\((.*?)\)`\*\*", _text(CONTRACT), re.S)
    assert found is not None, "contract §5 no longer writes out Settings(...)"
    return " ".join(found[1].split())


def test_the_guides_give_the_contract_its_number_of_sections() -> None:
    sections = _contract_sections()
    said = {
        (page.relative_to(REPO).as_posix(), int(n))
        for page in PAGES
        for n in SECTION_COUNT.findall(" ".join(FENCE.sub("", _text(page)).split()))
    }
    assert {page for page, _ in said} >= {"README.md", "docs/maintainers.md"}
    wrong = sorted((page, n) for page, n in said if n != sections)
    assert not wrong, f"the contract has sections 1–{sections}, these pages say otherwise: {wrong}"


def test_the_section_count_pattern_reads_how_the_guides_say_it() -> None:
    assert SECTION_COUNT.findall("the public contract, sections 1–13, that") == ["13"]
    assert SECTION_COUNT.findall("the page's sections must run 1 to 9 in order") == ["9"]
    assert SECTION_COUNT.findall("sections 1-4 and §§8–11") == ["4"]


def test_the_contract_writes_out_every_field_of_settings_with_its_default() -> None:
    call = ast.parse(f"Settings({_settings_signature()})", mode="eval").body
    assert isinstance(call, ast.Call) and not call.args
    written: dict[str, object] = {}
    for keyword in call.keywords:
        value = keyword.value
        assert keyword.arg is not None
        written[keyword.arg] = value.id if isinstance(value, ast.Name) else ast.literal_eval(value)
    fields = {
        f.name: getattr(f.default, "__name__", f.default) for f in dataclasses.fields(Settings)
    }
    assert list(written) == list(fields), "contract §5's Settings(...) names other fields"
    assert written == fields, "contract §5's Settings(...) gives other defaults"


def test_every_file_the_maintainers_guide_names_exists() -> None:
    named = set(CHECKOUT_PATH.findall(_text(MAINTAINERS)))
    assert len(named) >= 40, "the pattern no longer finds the guide's paths"
    missing = sorted(p for p in named if not (REPO / p).exists())
    assert not missing, f"docs/maintainers.md names what the checkout lacks: {missing}"


def _public_names_listed() -> list[str]:
    """The names of contract §5's list of what ``mnestoma`` exports, each line's label left
    out ("errors       MnestomaError, ..." gives MnestomaError, ...)."""
    prose = _text(CONTRACT)
    section = prose[prose.index("## 5. ") : prose.index("## 6. ")]
    block = re.search(r"```text\n(.*?)```", section, re.S)
    assert block is not None, "contract §5 no longer lists the public names in a block"
    names = []
    for line in block[1].splitlines():
        listed = line if line.startswith(" ") else line.split(maxsplit=1)[1]
        names += re.findall(r"[A-Za-z_]\w*", listed)
    return names


def test_the_contract_lists_every_public_name() -> None:
    listed = _public_names_listed()
    assert len(listed) == len(set(listed)), "contract §5 lists a name twice"
    assert sorted(listed) == sorted(mnestoma.__all__), (
        f"contract §5 lists {sorted(set(listed) - set(mnestoma.__all__))} beyond mnestoma.__all__"
        f" and leaves out {sorted(set(mnestoma.__all__) - set(listed))}"
    )
