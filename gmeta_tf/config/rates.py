"""Bit rates as people and ``tc`` write them (``100mbit``, ``1gbit``): one parser for the config
(``cluster.link_rate``) and the network emulation (launch/network/profile.py).

Units are decimal bit/s, as ``tc`` reads them (``kbit`` = 1000 bit/s). ``bps``-style units are
refused, because ``tc`` reads them as *bytes* per second: a silent 8x.
"""
from __future__ import annotations

import re
from typing import Optional

RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


def bit_rate(text: str) -> Optional[int]:
    """``'100mbit'`` -> 100_000_000; None for anything else (the caller names the field)."""
    m = _RATE.match(str(text).lower())
    if not m or m.group(2) not in ("", *RATE_UNITS):
        return None
    return int(float(m.group(1)) * RATE_UNITS[m.group(2) or "bit"])


def format_rate(bit_s: int) -> str:
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bit_s >= RATE_UNITS[unit] and bit_s % RATE_UNITS[unit] == 0:
            return f"{bit_s // RATE_UNITS[unit]}{unit}"
    return f"{bit_s}bit"
