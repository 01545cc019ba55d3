"""Failures on the command line: one redacted line on stderr and an exit status, never a
traceback (unless ``--debug``) and never a secret the user gave.

Bad input (``InvalidInput``, a usage error) exits 2 with nothing written; any other failure
exits 1.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import click
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from mnestoma.core.errors import InvalidInput, MnestomaError
from mnestoma.engines import ENV_DATABASE_URL, MIN_BARE_SECRET_CHARS, redact_text, secrets_of

__all__ = ["CliBadInput", "CliFailure", "MnestomaGroup", "remember_secret", "scrub"]

_SECRETS: set[str] = set()


def remember_secret(url: str | None) -> None:
    """Note the secrets of a URL the user gave (its password, the values of its secret query
    keys such as ``?password=``, a password inside a connection string), so that no message
    can repeat them."""
    if not url:
        return
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return
    _SECRETS.update(s for s in secrets_of(parsed) if len(s) >= MIN_BARE_SECRET_CHARS)


def scrub(message: str) -> str:
    """The message with every URL password and every known secret hidden."""
    remember_secret(os.environ.get(ENV_DATABASE_URL))
    return redact_text(message, _SECRETS)


class _DriverEcho(logging.Filter):
    """Drops psycopg's "error ignored terminating <psycopg.Pipeline ...>" warning: the
    error that ended the pipeline is the one the command reports, on its one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("error ignored terminating")


_DRIVER_ECHO = _DriverEcho()


def _quiet_driver_echoes() -> None:
    """Keep a failure on one stderr line: no second line from the driver's logger."""
    logger = logging.getLogger("psycopg")
    if _DRIVER_ECHO not in logger.filters:
        logger.addFilter(_DRIVER_ECHO)


class CliFailure(click.ClickException):
    """A failure shown as one line, exit status 1 (not found, refused, conflict, ...).

    A click exception, not one of the package's errors: it is how the command line shows
    them, and only the command line imports click.
    """

    exit_code = 1


class CliBadInput(CliFailure):
    """Bad input (``InvalidInput``) shown as one line, exit status 2."""

    exit_code = 2


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    if not isinstance(err, MnestomaError):
        text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    first = text.splitlines()[0] if text else type(err).__name__
    return scrub(first)


def _error_line(message: str) -> None:
    click.echo(f"Error: {scrub(message)}", err=True)


class MnestomaGroup(click.Group):
    """A group that turns every failure into one redacted line and an exit status."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError):
            raise
        except Exception as err:
            if ctx.find_root().params.get("debug"):
                raise
            failure = CliBadInput if isinstance(err, InvalidInput) else CliFailure
            raise failure(_one_line(err)) from err

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        _quiet_driver_echoes()
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as err:
            err.show()
            sys.exit(err.exit_code)
        except click.UsageError as err:
            hint = f" (see '{err.ctx.command_path} --help')" if err.ctx is not None else ""
            _error_line(err.format_message() + hint)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            _error_line(err.format_message())
            sys.exit(err.exit_code)
        except click.Abort:
            _error_line("aborted")
            sys.exit(1)
        except BrokenPipeError:
            # The reader went away (``mnestoma edges | head``): stop quietly. Python's own
            # advice: point stdout at devnull so that the flush at exit cannot fail again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)
