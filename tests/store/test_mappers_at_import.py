"""The package's mappers are configured when it is imported, not by the first snapshot a
call builds: an exception landing inside SQLAlchemy's lazy configuration (a
KeyboardInterrupt, a signal handler's exception during a process's first passing) would
leave the registry unusable for the rest of the process."""

from __future__ import annotations

from warm_python import run_python_warm

CHECK = """
import mnestoma
from mnestoma.schema.models import Base
pending = [m.class_.__name__ for m in Base.registry.mappers if not m.configured]
assert not pending, pending
"""


def test_importing_the_package_leaves_none_of_its_mappers_to_configure() -> None:
    done = run_python_warm(CHECK)
    assert done.returncode == 0, done.stderr
