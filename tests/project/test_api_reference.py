"""The API reference (docs/api) names every public name of the package."""

from __future__ import annotations

import re

from conftest import REPO

import mnestoma

API = REPO / "docs" / "api"


def _documented() -> set[str]:
    names: set[str] = set()
    for page in API.glob("*.rst"):
        text = page.read_text()
        names |= set(re.findall(r"^\.\. auto(?:class|function):: mnestoma\.(\w+)$", text, re.M))
        for listed in re.findall(r":members: ([\w,\s]+?)\n\n", text):
            names |= {n.strip() for n in listed.split(",")}
    return names


def test_every_public_name_of_the_package_is_in_the_api_reference() -> None:
    public = {name for name in mnestoma.__all__ if not name.startswith("_")}
    missing = public - _documented()
    assert not missing, f"not in docs/api: {sorted(missing)}"
