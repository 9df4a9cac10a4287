"""hwmodels: hardware as data.

One YAML file per device (hwmodels/devices/<name>.yaml), every number with its unit and
source. `load_device(name_or_path)` validates a file and returns a `Device`; any problem is
a `HardwareFileError` (a ValueError) whose one-line message names the file and the field.
`python -m hwmodels list|show NAME`; `python -m hwmodels.calibrate --device cpu|cuda`
measures the local device and writes a file of the same schema.

Never imports torch (only hwmodels.calibrate does, lazily).
"""
from .device import FALLBACK, Device
from .errors import HardwareFileError
from .registry import DEVICES_DIR, list_devices, load_device

__all__ = ["Device", "HardwareFileError", "load_device", "list_devices", "DEVICES_DIR", "FALLBACK"]
