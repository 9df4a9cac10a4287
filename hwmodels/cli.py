"""Shared CLI plumbing: argparse that reports a mistake as one line and exits 2."""
from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the message; a user mistake here is one line, exit code 2."""

    def error(self, message):
        print(f"error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)
