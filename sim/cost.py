"""Cost per million output tokens from a throughput and an hourly price per device.

cost_per_mtok = price (USD per device-hour) x devices / 3600 s x 1e6 / output tokens per second. The price
is the device's documented default (hwmodels.platform.default_price, with its source, date and file) unless a
caller overrides it (`--price-per-hour`, which works for any device file, whatever its name); a device with
neither gives None with a note. The device is the prediction's own loaded Device (sim.energy.prediction_device):
a user's file reads its own `<stem>.platform.yaml`, never a shipped SKU's price because its name resembles one.
"""
from __future__ import annotations

import math

from hwmodels.platform import default_price
from sim.energy import display_path, own_platform_file, prediction_device


def cost_per_mtok(tokens_per_s: float, usd_per_hour: float, devices: int = 1) -> float:
    """USD per million output tokens; inf when nothing is produced."""
    if usd_per_hour < 0 or not math.isfinite(usd_per_hour):
        raise ValueError(f"price per hour must be a finite number >= 0, got {usd_per_hour}")
    if tokens_per_s <= 0:
        return math.inf
    return usd_per_hour * devices / 3600.0 * 1e6 / tokens_per_s


def price_per_hour(hw, override: float | None = None) -> tuple[float | None, str]:
    """(USD per device-hour, where it comes from): the override, else the device's default, else None.
    `hw`: a loaded Device (or a path or shipped name); not read at all when an override is given."""
    if override is not None:
        if not math.isfinite(override) or override < 0:
            raise ValueError(f"--price-per-hour must be a finite number >= 0, got {override}")
        return float(override), "command line"
    price = default_price(hw)
    if price is None:
        own = own_platform_file(hw) if not isinstance(hw, str) else None
        return None, ("no price data for " + getattr(hw, "name", str(hw)) + "; give --price-per-hour"
                      + (f" or a price section in {own}" if own else ""))
    return price.usd_per_hour, f"{price.source} [{price.date}] ({display_path(price.file)})"


def cost_summary(prediction, hw=None, override: float | None = None) -> dict:
    """cost_per_mtok at the point's batch and at the largest batch that fits (steady state), with the price."""
    device = prediction_device(prediction, hw) if override is None else None     # an override needs no file
    usd, source = price_per_hour(device, override)
    price = default_price(device) if device is not None else None
    where = display_path(price.file) if price is not None else "command line" if override is not None else None
    devices = int(prediction.extra.get("devices", 1))
    if usd is None:
        return dict(cost_per_mtok=None, cost_per_mtok_at_max_batch=None, price_usd_per_hour=None,
                    price_source=source, price_file=None, devices=devices)
    at_max = (cost_per_mtok(prediction.max_batch_tokens_per_s, usd, devices) if prediction.max_batch > 0 else None)
    return dict(cost_per_mtok=cost_per_mtok(prediction.tokens_per_s, usd, devices), cost_per_mtok_at_max_batch=at_max,
                price_usd_per_hour=usd, price_source=source, price_file=where, devices=devices)
