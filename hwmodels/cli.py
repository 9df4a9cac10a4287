"""Command-line plumbing of hwmodels' CLIs: the one kit of every kvsim CLI lives in kvcommon.cli (the bottom
layer); re-exported here for hwmodels' users."""
from kvcommon.cli import (DefaultsHelpFormatter, OneLineParser, atomic_write_bytes, atomic_write_text,  # noqa: F401
                          atomic_writer, fail, progress_disabled)

__all__ = ["DefaultsHelpFormatter", "OneLineParser", "atomic_write_bytes", "atomic_write_text", "atomic_writer",
           "fail", "progress_disabled"]
