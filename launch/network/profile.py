"""What one emulated host's link is: ``LinkProfile``, parsed from a ``--network`` value.

A value is either a named profile (``NAMED``; docs/network.md says where each number comes
from) or ``key=value`` pairs separated by commas: ``rate=100mbit,loss=0.02``. Rates are bit/s
with tc's decimal units (``kbit`` = 1000 bit/s); ``bps``-style units are refused because tc
reads them as *bytes* per second, a silent 8x. Delay is refused with the reason: this kernel
has no ``netem`` (docs/network.md, "Limits").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional

from gmeta_tf.config.rates import bit_rate, format_rate
from gmeta_tf.errors import NetworkEmulationError

LOOPBACK = "loopback"
__all__ = ["LinkProfile", "NAMED", "format_rate", "parse_rate", "parse_loss", "parse_profile"]


@dataclass(frozen=True)
class LinkProfile:
    """One host's link, each direction. ``rate_bit_s=None``: unshaped; ``loss``: the probability
    that a packet leaving either end is dropped. ``emulated`` is False only for ``loopback``:
    no namespaces at all, today's single-host launch."""
    name: str
    rate_bit_s: Optional[int] = None
    loss: float = 0.0
    emulated: bool = True

    def describe(self) -> str:
        if not self.emulated:
            return "loopback (no emulation)"
        rate = "unshaped" if self.rate_bit_s is None else format_rate(self.rate_bit_s)
        return f"{self.name}: {rate}, loss {self.loss:g}"


# Named profiles: docs/network.md, "Named profiles", gives each number's source.
NAMED: Dict[str, LinkProfile] = {
    LOOPBACK: LinkProfile(LOOPBACK, emulated=False),
    "bridge": LinkProfile("bridge"),                              # own hosts, unshaped links
    "10gbe": LinkProfile("10gbe", rate_bit_s=10 * 10**9),          # IEEE 802.3ae/an server NIC
    "1gbe": LinkProfile("1gbe", rate_bit_s=10**9),                 # IEEE 802.3ab 1000BASE-T
    "100mbe": LinkProfile("100mbe", rate_bit_s=100 * 10**6),       # IEEE 802.3u 100BASE-TX
    "20mbit": LinkProfile("20mbit", rate_bit_s=20 * 10**6),        # issue 33's first look
    "1gbe-lossy": LinkProfile("1gbe-lossy", rate_bit_s=10**9, loss=0.001),  # a flaky NIC/cable
}


def parse_rate(raw: str) -> int:
    """``'100mbit'`` -> 100_000_000 (bit/s)."""
    value = bit_rate(raw)
    if value is None:
        hint = " (tc reads 'bps' as bytes per second: write bit/s)" if raw.lower().endswith("bps") else ""
        raise NetworkEmulationError(f"rate {raw!r} is not a bit rate like 100mbit or 1gbit{hint}")
    if value < 8000:
        raise NetworkEmulationError(f"rate {raw!r} is below 8kbit: tc cannot shape that low")
    return value


def parse_loss(raw: str) -> float:
    try:
        p = float(raw)
    except ValueError:
        raise NetworkEmulationError(f"loss {raw!r} is not a probability like 0.02") from None
    if not (0.0 <= p < 1.0) or math.isnan(p):
        raise NetworkEmulationError(f"loss {raw!r} must be in [0, 1): a probability, not a percentage")
    return p


def parse_profile(value: Optional[str]) -> LinkProfile:
    """A ``--network`` value: a name of ``NAMED`` or ``rate=...,loss=...``."""
    raw = (value or LOOPBACK).strip()
    if raw.lower() in NAMED:
        return NAMED[raw.lower()]
    if "=" not in raw:
        raise NetworkEmulationError(
            f"--network {raw!r} is neither a named profile ({', '.join(NAMED)}) nor key=value pairs "
            "like rate=1gbit,loss=0.01")
    fields: Dict[str, str] = {}
    for part in raw.split(","):
        key, sep, val = part.partition("=")
        key = key.strip().lower()
        if not sep or not val.strip():
            raise NetworkEmulationError(f"--network {raw!r}: {part!r} is not key=value")
        if key in fields:
            raise NetworkEmulationError(f"--network {raw!r}: {key} is given twice")
        fields[key] = val.strip()
    rate = parse_rate(fields.pop("rate")) if "rate" in fields else None
    loss = parse_loss(fields.pop("loss")) if "loss" in fields else 0.0
    if "delay" in fields:
        raise NetworkEmulationError(
            f"--network {raw!r}: delay={fields['delay']} cannot be emulated here: the kernel has no "
            "netem (CONFIG_NET_SCH_NETEM); see docs/network.md")
    if fields:
        raise NetworkEmulationError(f"--network {raw!r}: unknown key(s) {', '.join(sorted(fields))}; "
                                    "known: rate, loss")
    return LinkProfile(raw, rate_bit_s=rate, loss=loss)
