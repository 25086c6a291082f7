"""What a whole ``make bench`` runs and the smoke does not: the smoke's stand-ins must leave it
alone. Found by a whole run (2026-11-29): ``distributed``'s stand-in loop read the smoke's
1 worker + 1 PS row in every mode (``dict.setdefault`` evaluates its default), so the whole
bench failed with ``KeyError: 'tasks_per_s_1w1ps'`` after the meta section, while the smoke,
which runs that row, passed."""
from __future__ import annotations

from bench.distributed import JOBS, SMOKE_JOBS, launched_rows


def test_a_whole_run_keeps_its_own_rows():
    rates = {"tasks_per_s_1proc": 3000.0, "tasks_per_s_2w2ps": 1200.0, "tasks_per_s_2w1ps": 1100.0}
    assert launched_rows(dict(rates), smoke=False) == rates


def test_the_smoke_row_stands_for_every_launched_row():
    w, p = SMOKE_JOBS[0]
    got = launched_rows({"tasks_per_s_1proc": 3000.0, f"tasks_per_s_{w}w{p}ps": 900.0}, smoke=True)
    assert {got[f"tasks_per_s_{a}w{b}ps"] for a, b in JOBS} == {900.0}
