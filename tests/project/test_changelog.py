"""One version everywhere, and a changelog with a dated section per release.

``mnestoma.__version__`` is the one source: hatchling builds the distribution's metadata from
it, and it names the newest release of ``CHANGELOG.md``. Each release there has a date and
the schema head it needs; ``Unreleased`` sits on top with the head the checkout builds.
"""

from __future__ import annotations

import importlib.metadata
import re
from datetime import date

from conftest import REPO
from hatchling.metadata.core import ProjectMetadata
from hatchling.plugin.manager import PluginManager

import mnestoma

CHANGELOG = REPO / "CHANGELOG.md"
SECTION = re.compile(r"^## \[(?P<name>[^\]]+)\](?P<rest>.*)$", re.M)
RELEASE_REST = re.compile(r" - (\d{4}-\d{2}-\d{2})")
SCHEMA_HEAD = re.compile(r"^Schema head: \*\*(\d{4})\*\*", re.M)


def sections() -> list[tuple[str, str, str]]:
    """Each ``## [...]`` section of the changelog: (name, the rest of its heading, body)."""
    text = CHANGELOG.read_text(encoding="utf-8")
    found = list(SECTION.finditer(text))
    ends = [m.start() for m in found[1:]] + [len(text)]
    return [(m["name"], m["rest"], text[m.end() : end]) for m, end in zip(found, ends, strict=True)]


def releases() -> list[tuple[tuple[int, ...], date, str]]:
    """The released sections, newest first: (version, date, schema head)."""
    out = []
    for name, rest, body in sections()[1:]:
        dated = RELEASE_REST.fullmatch(rest)
        assert dated, f"## [{name}]{rest}: a release's heading is '## [X.Y.Z] - YYYY-MM-DD'"
        heads = SCHEMA_HEAD.findall(body)
        assert len(heads) == 1, f"{name}: one 'Schema head: **NNNN**' line"
        version = tuple(int(part) for part in name.split("."))
        assert len(version) == 3, name
        out.append((version, date.fromisoformat(dated[1]), heads[0]))
    return out


def test_the_version_is_one_in_the_package_its_metadata_and_the_newest_release() -> None:
    newest = ".".join(str(part) for part in releases()[0][0])
    assert mnestoma.__version__ == newest
    # the installed distribution's metadata (reinstall the checkout after a release)
    assert importlib.metadata.version("mnestoma") == mnestoma.__version__
    # what a build of the checkout writes: read from __version__, not kept in pyproject.toml
    project = ProjectMetadata(str(REPO), PluginManager())
    assert project.dynamic == ["version"] and project.version == mnestoma.__version__


def test_the_changelog_has_unreleased_on_top_then_dated_releases_newest_first() -> None:
    (top, rest, body), *_ = sections()
    assert (top, rest) == ("Unreleased", "")
    assert SCHEMA_HEAD.findall(body) == [mnestoma.head_revision()]
    found = releases()
    versions = [v for v, _, _ in found]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    assert versions[-1] == (0, 1, 0)
    dates = [d for _, d, _ in found]
    assert dates == sorted(dates, reverse=True) and dates[0] <= date.today()
    heads = [mnestoma.head_revision(), *(h for _, _, h in found)]
    assert heads == sorted(heads, reverse=True)  # a release never needs an older schema
    scripts = {p.name[:4] for p in (REPO / "migrations" / "versions").glob("[0-9]*.py")}
    assert set(heads) <= scripts


def test_the_readme_installs_the_wheel_of_the_current_version() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    wheels = set(re.findall(r"mnestoma-(\d+\.\d+\.\d+)-py3-none-any\.whl", readme))
    assert wheels == {mnestoma.__version__}
