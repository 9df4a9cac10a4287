"""--calibrate FILE.yaml: the hwmodels.calibrate microbenchmarks before every model of every round, merged
into the hardware file the points are predicted on."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from traces.timing_format import TimingError


@dataclass
class RoundCalibration:
    """--calibrate FILE: the hwmodels.calibrate microbenchmarks before every model of every round, so the
    hardware file samples the same machine phases as the points (one calibration per round was not enough:
    a 20-second snapshot per 3-minute round caught 12 GB/s in one round and 15-16 GB/s in the next while the
    points' own speed moved by 5%); after the last round FILE is their merge (median per series and size).
    Each calibration stays in `folder`, so a resumed run calibrates only the blocks it has not done."""
    target: Path
    folder: Path        # <out>/calibration-rounds
    device: str         # "cpu" or "cuda"
    quick: bool
    threads: int
    calibrated: list = field(default_factory=list)
    kept: list = field(default_factory=list)

    def path(self, rnd: int, model: str) -> Path:
        return self.folder / f"round-{rnd}-{model}.yaml"

    def clear(self) -> None:
        """--fresh: an earlier run's calibrations belong to the points it measured."""
        for old in self.folder.glob("round-*.yaml"):
            old.unlink()

    def before_block(self, rnd: int, model: str, progress) -> None:
        """Calibrate right before `model`'s points of round `rnd` (unless an earlier run did)."""
        path = self.path(rnd, model)
        if path.is_file():
            self.kept.append(path)
            return
        import torch
        from hwmodels.calibrate.cli import measure, write_calibration
        from hwmodels.errors import HardwareFileError

        torch.set_num_threads(self.threads)   # calibrated with the thread count the points use
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            cal = measure(self.device, self.quick, os.environ.get("OMP_WAIT_POLICY", "unset"),
                          lambda label: progress.set_postfix_str(f"calibrate round {rnd} {model}: {label}"),
                          say=progress.write,
                          # the grid's own spinning threads keep the load average near their count
                          own_load=self.threads)
            write_calibration(cal, f"{self.target.stem}-round-{rnd}-{model}", path)
        except (RuntimeError, OSError, HardwareFileError) as exc:
            raise TimingError(f"calibration before round {rnd} ({model}) failed: "
                              f"{str(exc).splitlines()[0]}") from None
        self.calibrated.append(path)

    def merge(self, rounds: int, models: list[str]) -> str:
        from hwmodels.calibrate.merge import merge_files
        paths = [self.path(r, m) for r in range(1, rounds + 1) for m in models]
        try:
            merge_files(paths, self.target, self.target.stem)
        except (OSError, ValueError) as exc:
            raise TimingError(f"merging the round calibrations into {self.target} failed: {exc}") from None
        return (f"calibration: {len(self.calibrated)} run(s) now, {len(self.kept)} kept from an earlier run; "
                f"{self.target} = median over {len(paths)} calibration runs (before every model of every round)")
