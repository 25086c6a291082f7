"""Faults on an emulated link, scheduled by training step: ``--network-fault ps0:cut=5@20``.

A reliability test (or a user rehearsing one) needs a fault at a point of the training, not at
a wall-clock time that a loaded machine shifts: each fault fires once, when a worker has logged
(or named in a failure) a step at or past its ``@STEP``. Kinds are the ``EmulatedNetwork`` hooks:
``cut=SECONDS`` takes the host's link down for that long, ``loss=P`` drops each packet with
probability P from then on, ``rate=RATE`` reshapes the host's link (a straggler).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from gmeta_tf.errors import NetworkEmulationError
from launch.network.profile import parse_loss, parse_rate

_SPEC = re.compile(r"^(?P<host>[a-z][a-z0-9]*):(?P<kind>cut|loss|rate)=(?P<value>[^@]+)@(?P<step>\d+)$")


@dataclass(frozen=True)
class NetworkFault:
    host: str
    kind: str  # cut | loss | rate
    value: float  # seconds, probability or bit/s
    at_step: int

    def apply(self, net) -> None:
        if self.kind == "cut":
            net.cut(self.host, self.value, wait=False)
        elif self.kind == "loss":
            net.set_loss(self.host, self.value)
        else:
            net.set_rate(self.host, int(self.value))


def parse_fault(text: str) -> NetworkFault:
    m = _SPEC.match(text.strip())
    if m is None:
        raise NetworkEmulationError(f"--network-fault {text!r}: expected HOST:KIND=VALUE@STEP with KIND cut "
                                    f"(seconds), loss (probability) or rate (e.g. 10mbit), e.g. ps0:cut=5@20")
    kind, raw = m["kind"], m["value"]
    if kind == "cut":
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise NetworkEmulationError(f"--network-fault {text!r}: cut needs a positive number of seconds")
    else:
        value = parse_loss(raw) if kind == "loss" else float(parse_rate(raw))
    return NetworkFault(m["host"], kind, value, int(m["step"]))
