"""Deprecated home of the CLI kit: it lives in kvcommon.cli (the bottom layer). Re-exported here only until
sim's last importers (progress_disabled) switch; hwmodels' own CLIs import kvcommon.cli."""
from kvcommon.cli import (DefaultsHelpFormatter, OneLineParser, atomic_write_bytes, atomic_write_text,  # noqa: F401
                          atomic_writer, fail, progress_disabled)

__all__ = ["DefaultsHelpFormatter", "OneLineParser", "atomic_write_bytes", "atomic_write_text", "atomic_writer",
           "fail", "progress_disabled"]
