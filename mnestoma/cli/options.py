"""What the commands share to read their arguments: the ``--database-url``, ``--json`` and
``--limit`` options, optional numbers with a floor, and the parsers of endpoints, tags and
instants.

A parser raises ``InvalidInput`` (exit status 2) with one line that names the argument.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from sqlalchemy.engine import URL

from mnestoma.cli.errors import remember_secret
from mnestoma.core.errors import InvalidInput
from mnestoma.core.types import EARLIEST_CLOCK, ensure_instant
from mnestoma.engines import ENV_REPLICA_URLS, resolve_database_url
from mnestoma.engines.replicas import replica_urls

__all__ = [
    "command_url",
    "database_url_option",
    "json_option",
    "limit_option",
    "number_option",
    "parse_cutoff",
    "parse_endpoint",
    "parse_instant",
    "parse_tags",
    "replicas_of",
    "split_replica_urls",
    "url_option_callback",
]


def url_option_callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Remember the URL's secrets; an empty URL (an unset shell variable) is bad input."""
    remember_secret(value)
    if isinstance(value, str) and not value.strip():
        raise click.BadParameter(
            "the URL is empty (an unset variable?): give a URL, or leave the option out"
        )
    return value


def database_url_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--database-url URL``: overrides MNESTOMA_DATABASE_URL and the default SQLite file."""
    return click.option(
        "--database-url",
        "database_url",
        metavar="URL",
        default=None,
        callback=url_option_callback,
        expose_value=True,
        help="SQLAlchemy URL of the store (overrides MNESTOMA_DATABASE_URL, MNESTOMA_DB_PATH).",
    )(f)


def limit_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--limit N``: print at most N rows (the first ones in the listing's order)."""
    return click.option(
        "--limit",
        "limit",
        type=int,
        default=None,
        metavar="N",
        help=f"Print at most N {what} (default: all).",
    )


def number_option(
    flag: str, kind: type[int] | type[float], minimum: float, metavar: str, help: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``flag`` followed by a number of ``kind`` (int or float) at least ``minimum``, None
    when the option is left out (the command then takes its own default)."""
    bounded = click.IntRange(min=int(minimum)) if kind is int else click.FloatRange(min=minimum)
    dest = flag.lstrip("-").replace("-", "_")
    return click.option(flag, dest, type=bounded, default=None, metavar=metavar, help=help)


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``: machine-readable output instead of a table."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def command_url(database_url: str | None) -> str | None:
    """The URL given on this subcommand, else the group's ``--database-url``, else None."""
    if database_url is not None:
        return database_url
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    return root.params.get("database_url") if root is not None else None


# What separates the URLs of MNESTOMA_REPLICA_URLS: whitespace, which no URL holds unescaped;
# and, as before, a comma followed by the next URL's scheme ("a,postgresql://b"). A comma
# anywhere else is the URL's own (a password's, a libpq host list's).
_REPLICA_URLS_SEPARATOR = re.compile(r"\s+|,(?=\s*[A-Za-z][A-Za-z0-9+.-]*://)")


def split_replica_urls(given: str) -> list[str]:
    """The URLs of a ``MNESTOMA_REPLICA_URLS`` value: separated by whitespace (or by a comma
    before the next URL's scheme), each whole, commas within it kept."""
    parts = (part.strip().strip(",") for part in _REPLICA_URLS_SEPARATOR.split(given))
    return [part for part in parts if part]


def replicas_of(database_url: str | None) -> list[URL] | None:
    """The read replicas of ``MNESTOMA_REPLICA_URLS`` (see :func:`split_replica_urls`),
    checked against the store's URL (a SQLite store has none: :class:`InvalidInput` naming
    the variable); their secrets are remembered, so that no message repeats them."""
    urls = split_replica_urls(os.environ.get(ENV_REPLICA_URLS, ""))
    for url in urls:
        remember_secret(url)
    if not urls:
        return None
    return replica_urls(resolve_database_url(database_url), urls, from_env=True)


def parse_endpoint(value: str, what: str, *, version_required: bool) -> tuple[str, str | None]:
    """``EXECUTOR@VERSION`` → (executor, version); the last ``@`` separates them."""
    executor, sep, version = value.rpartition("@")
    if not sep:
        if version_required:
            raise InvalidInput(f"{what} must be EXECUTOR@VERSION, got {value!r}")
        return value, None
    if not executor or not version:
        raise InvalidInput(f"{what} must be EXECUTOR@VERSION, got {value!r}")
    return executor, version


def parse_tags(pairs: Sequence[str]) -> dict[str, str] | None:
    """``K=V`` pairs → a dict (None when there are none)."""
    tags: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"--tag must be KEY=VALUE, got {pair!r}")
        tags[key.strip()] = value
    return tags or None


def parse_instant(value: str, what: str) -> datetime:
    """An ISO-8601 instant with a zone, in UTC, that the store can take as its now (an offset
    that moves it out of the years 1 to 9999 is bad input, not an overflow)."""
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"{what} must be an ISO-8601 time, got {value!r}") from None
    if when.tzinfo is None:
        raise InvalidInput(f"{what} needs a time zone, e.g. 2026-04-02T03:00:00Z")
    return ensure_instant(when, what, earliest=EARLIEST_CLOCK)


def parse_cutoff(before: str | None, older_than: float | None, now: datetime) -> datetime:
    """The cutoff of ``--before DATE`` (an ISO-8601 date or time, UTC when it names no zone)
    or ``--older-than DAYS`` (a positive number of days before ``now``): exactly one."""
    if before is not None and older_than is None:
        try:
            when = datetime.fromisoformat(before.strip())
        except ValueError:
            raise InvalidInput(
                f"--before must be an ISO-8601 date or time, got {before!r}"
            ) from None
        return ensure_instant(when.replace(tzinfo=UTC) if when.tzinfo is None else when, "--before")
    if before is not None or older_than is None:
        raise InvalidInput("give exactly one of --before DATE and --older-than DAYS")
    if not (math.isfinite(older_than) and older_than > 0):
        raise InvalidInput(f"--older-than must be a positive number of days, got {older_than:g}")
    try:
        return now - timedelta(days=older_than)
    except OverflowError:
        raise InvalidInput(f"--older-than {older_than:g} reaches before year 1") from None
