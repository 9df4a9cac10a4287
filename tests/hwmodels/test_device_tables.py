"""hwmodels.device.CalibratedTables: the optional calibrated tables as one object with neutral defaults."""
import numpy as np

from hwmodels import load_device
from hwmodels.device import NEUTRAL, TABLE_FIELDS, CalibratedTables


def test_neutral_tables_leave_the_roofline_alone():
    assert all(getattr(NEUTRAL, f) is None for f in TABLE_FIELDS)
    assert NEUTRAL.gemm_rows_efficiency(8) is None
    assert NEUTRAL.attn_scores_factor(128) == 1.0 and NEUTRAL.attn_values_factor(64) == 1.0
    np.testing.assert_array_equal(NEUTRAL.fresh_alloc_factor(np.array([1e3, 1e9])), [1.0, 1.0])
    assert CalibratedTables() == NEUTRAL


def test_datasheet_devices_have_the_neutral_tables_and_calibrated_ones_their_own():
    assert load_device("a100-80g-sxm").tables is NEUTRAL
    cpu = load_device("cpu-local")
    if cpu.calibration:
        assert cpu.tables is not NEUTRAL
    for f in TABLE_FIELDS:                       # one object holds them: no flat copies on the device
        assert not hasattr(cpu, f)
