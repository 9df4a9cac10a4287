"""The one exception type of hwmodels."""
from __future__ import annotations


class HardwareFileError(ValueError):
    """A hardware file (or device name) that cannot be used; the message is one line naming
    the file and the field, e.g. `h200-sxm.yaml: memory_bandwidth.unit: unit 'GB' is a
    size in bytes, not a bandwidth; expected one of ...`."""

    def __init__(self, path, field: str | None, problem: str):
        self.path = str(path)
        self.field = field
        self.problem = problem
        where = f"{self.path}: {field}" if field else self.path
        super().__init__(f"{where}: {problem}")
