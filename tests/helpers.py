"""Assertions several test modules share."""
from __future__ import annotations


def assert_one_line_error(code, err: str, fragment: str, out: str | None = None) -> None:
    """The contract every CLI keeps for a user's mistake: exit status 2 and a single `error: ...` line on
    stderr that names the problem (`fragment`); with `out`, also nothing on stdout."""
    assert code == 2
    if out is not None:
        assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err
