"""The ``pgjobs`` command line."""

from pgjobs.cli.main import main

__all__ = ["main"]
