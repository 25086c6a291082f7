"""The network bench's summary and window (bench/network_summary.py, bench/network_paths.py) on
made-up numbers: which point is the "waits >= 50%" one, the ratios the headline keys report,
the figures a window's two ends give, and which sweep runs. No emulated host is started."""
from __future__ import annotations

import pytest

from bench import network_paths
from bench.network_paths import F32, FULL_ENV, PATHS, Mark, Window, figures, ratios, sweep_from_env
from bench.network_summary import best_path, repeats_summary, summarize, wait_point

pytestmark = pytest.mark.fast


def _p(tps: float, kb: float, step_ms: float) -> dict:
    return {"tasks_per_s": tps, "busiest_link_kb_per_step": kb, "step_ms": step_ms}


def _sweep() -> dict:
    # step_ms: the unshaped step is the same for every path (40 ms), so wait shares are exact.
    return ratios({
        "bridge": {"default": _p(800, 270, 40), "bf16": _p(780, 150, 40), "int8": _p(780, 120, 40), "hot_split": _p(760, 280, 40),
                   "hot_stale": _p(790, 120, 40), "lean": _p(784, 80, 40)},
        "100mbit": {"default": _p(700, 270, 50), "lean": _p(760, 80, 42)},
        "20mbit": {"default": _p(400, 270, 60), "lean": _p(700, 80, 45)},  # waits 1/3: below the bound
        "5mbit": {"default": _p(200, 270, 160), "bf16": _p(300, 150, 100), "int8": _p(330, 120, 90), "hot_split": _p(190, 280, 170),
                  "hot_stale": _p(350, 120, 80), "lean": _p(500, 80, 64)},
        "1mbit": {"default": _p(50, 270, 640), "lean": _p(150, 80, 200)},  # waits more, but 5mbit binds first
    })


def test_wait_share_is_against_the_same_path_unshaped():
    res = _sweep()
    assert res["5mbit"]["default"]["wait_share"] == pytest.approx(1 - 40 / 160)
    assert res["5mbit"]["lean"]["wait_share"] == pytest.approx(1 - 40 / 64)
    assert res["bridge"]["lean"]["wait_share"] == 0.0


def test_wait_point_is_the_first_rate_where_the_default_waits_half_its_step():
    res = _sweep()
    assert wait_point(res) == "5mbit"  # 0.75; 1mbit waits 0.94, 20mbit 0.33
    del res["5mbit"], res["1mbit"]
    assert wait_point(res) == "20mbit"  # none reaches the bound: where it waits most
    assert wait_point({"bridge": res["bridge"]}) is None


def test_headline_keys_and_their_ratios():
    res = _sweep()
    scale = {"default": _p(300, 540, 0), "lean": _p(660, 200, 0)}
    out = summarize(res, scale, "4w2ps")
    assert best_path(res["5mbit"]) == "lean"
    best = out["lean_best"]
    assert best["path"] == "lean" and best["point"] == "5mbit" and best["wait_bound_reached"] is True
    assert best["speedup"] == pytest.approx(500 / 200)
    assert best["wait_share_default"] == pytest.approx(0.75)
    assert best["bytes_ratio"] == pytest.approx(80 / 270)
    assert out["lean_4w"]["speedup"] == pytest.approx(660 / 300)
    assert out["lean_4w"]["bytes_ratio"] == pytest.approx(200 / 540)
    assert out["lean_4w"]["path"] == "lean" and out["lean_4w"]["hosts"] == "4w2ps"
    assert out["lean_unshaped"] == pytest.approx(784 / 800)
    assert out["unshaped_over_default"] == pytest.approx(
        {"bf16": 780 / 800, "int8": 780 / 800, "hot_split": 760 / 800, "hot_stale": 790 / 800, "lean": 784 / 800})
    # every path at every point carries its ratios against that point's default
    assert res["5mbit"]["hot_stale"]["speedup"] == pytest.approx(350 / 200)
    assert res["5mbit"]["bf16"]["bytes_ratio"] == pytest.approx(150 / 270)
    assert res["100mbit"]["default"]["speedup"] == 1.0
    assert "per_ps_over_per_table" not in out


def test_best_path_can_be_an_option_alone():
    res = _sweep()
    res["5mbit"]["lean"]["tasks_per_s"] = 100
    out = summarize(res)
    assert out["lean_best"]["path"] == "hot_stale"
    assert out["lean_best"]["speedup"] == pytest.approx(350 / 200)
    assert "lean_4w" not in out  # no 4-worker runs given


def test_figures_of_a_window(monkeypatch):
    counters = iter([{"ps0": (1_000, 2_000), "worker0": (0, 0)},
                     {"ps0": (61_000, 32_000), "worker0": (90_000, 150_000)}])
    monkeypatch.setattr(network_paths, "link_bytes", lambda ns: (0, 0))
    w = Window({"ps0": "ns-ps0", "worker0": "ns-w0"}, "/nonexistent", first=20, last=80)
    w.on_record(0, 1.0)  # still starting: no mark
    w.on_record(30, 10.0)  # the first record at or past 20
    w.on_record(30, 10.5)  # the same step again: not the window's end
    assert [m.step for m in w.marks] == [30] and not w.done.is_set()
    w.on_record(90, 16.0)
    assert [m.step for m in w.marks] == [30, 90] and w.done.is_set()
    w.on_record(100, 17.0)
    assert len(w.marks) == 2
    a, b = (Mark(m.step, m.at_unix, c) for m, c in zip(w.marks, counters))
    f = figures(a, b, ["ps0", "worker0"], rate_bit_s=5_000_000, workers=2)
    assert f["window_steps"] == 60
    assert f["tasks_per_s"] == pytest.approx(60 * 2 * 16 / 6.0)
    assert f["step_ms"] == pytest.approx(100.0)
    # worker0 sends 150 kB in 60 steps: 2,500 B per step, its busier direction
    assert f["busiest_link_kb_per_step"] == pytest.approx(2.5)
    assert f["wire_ps_bytes_per_step"] == pytest.approx((60_000 + 30_000) / 60)
    assert f["wire_busiest_host_bytes_per_step"] == pytest.approx(240_000 / 60)
    assert f["link_busy_share"] == pytest.approx(2_500 * 8 / 5e6 / 0.1)


def test_the_default_sweep_and_the_full_one():
    s = sweep_from_env({})
    assert s.points == ("bridge", "rate=100mbit", "rate=5mbit")
    assert list(s.paths) == ["default", "bf16", "int8", "hot_stale", "lean", "auto"]
    assert s.scale == (4, 2)
    full = sweep_from_env({FULL_ENV: "full"})
    assert len(full.points) == 5 and {"per_table", "unfused", "hot_split"} <= set(full.paths)
    lean = set(PATHS["lean"])  # all the options together (the baselines' float32 wire is not an option)
    assert {s for name in ("bf16", "int8", "hot_stale") for s in PATHS[name] if s not in ("hot.budget=0", F32)} <= lean
    assert F32 in PATHS["default"] and F32 not in lean  # the baseline: float32 whatever the default


def test_auto_is_judged_against_the_faster_of_split_on_and_off():
    from bench.network_summary import auto_choice

    res = _sweep()
    res["bridge"]["auto"] = _p(775, 150, 40)  # chose off (int8: 780); lean 784 is faster, within the noise
    res["5mbit"]["auto"] = _p(495, 80, 64)  # chose on: lean's 500
    out = auto_choice(res)
    assert out["over_faster"] == pytest.approx({"bridge": 775 / 784, "5mbit": 495 / 500})
    assert out["picks_faster"] is True
    res["5mbit"]["auto"] = _p(330, 120, 90)  # chose off where on was faster
    assert auto_choice(res)["picks_faster"] is False
    assert auto_choice({"bridge": {"default": _p(1, 1, 1)}}) == {}


def test_the_larger_ring_runs_auto_where_the_sweep_has_it():
    from bench.network_summary import scale_path

    res = _sweep()
    assert scale_path(res["5mbit"]) == "lean"  # no auto: the best path
    res["5mbit"]["auto"] = _p(495, 80, 64)
    assert scale_path(res["5mbit"]) == "auto"  # chooses its rows for the ring's worker count


def test_the_auto_path_is_told_the_point_s_link_rate():
    assert network_paths._point_sets("rate=5mbit", PATHS["auto"])[-1] == "cluster.link_rate=5mbit"
    assert network_paths._point_sets("bridge", PATHS["auto"]) == PATHS["auto"]  # unshaped: no rate
    # every job is told its rate, as `gmeta launch local --network` does: the sharding bench's jobs
    # run the default wire (auto), which is bfloat16 only where the job knows its link is slow
    assert network_paths._point_sets("rate=5mbit", PATHS["lean"]) == [*PATHS["lean"], "cluster.link_rate=5mbit"]


def test_every_network_headline_key_is_produced():
    from bench.run import HEADLINES, _get

    res = _sweep()
    res["bridge"]["auto"], res["5mbit"]["auto"] = _p(780, 150, 40), _p(500, 80, 64)
    scale = {"default": _p(300, 540, 0), "lean": _p(660, 200, 0)}
    results = {"network": {**res, **summarize(res, scale, "4w2ps"), "emulation": {"rate_error": -0.04},
                           "repeats": repeats_summary(_repeats())}}
    keys = [k for k, _, _ in HEADLINES if k.startswith("network.")]
    assert "network.lean_best.bytes_ratio" in keys and "network.lean_4w.speedup" in keys
    assert [k for k in keys if _get(results, k) is None] == []


def test_bench_run_help_and_unknown_sections(capsys):
    from bench.run import main

    assert main(["--help"]) == 0
    assert "network" in capsys.readouterr().out
    assert main(["no_such_section"]) == 2


def test_bytes_are_divided_by_the_steps_the_counters_span():
    # records at steps 20 and 80, 0.1 s a step; counters read 0.1 s (1 step) and 0.3 s (3 steps)
    # after them: they span 62 steps, not 60.
    a = Mark(20, 100.0, {"worker0": (0, 0)}, read_unix=100.1)
    b = Mark(80, 106.0, {"worker0": (0, 62_000)}, read_unix=106.3)
    f = figures(a, b, ["worker0"], rate_bit_s=None, workers=2)
    assert f["counted_steps"] == pytest.approx(62)
    assert f["busiest_link_kb_per_step"] == pytest.approx(1.0)
    assert f["step_ms"] == pytest.approx(100.0)  # time from the records alone


def _r(runs, ps_bytes: float) -> dict:
    """A path's figures over repeats as ``combine`` gives them: the median and every run's."""
    return {"tasks_per_s": sorted(runs)[len(runs) // 2], "runs_tasks_per_s": list(runs),
            "wire_ps_bytes_per_worker_step": ps_bytes}


def _repeats() -> dict:
    return {"bridge": {"default": _r([900, 600, 800], 150e3), "bf16": _r([880, 620, 790], 86e3),
                       "auto": _r([760, 700, 720], 86e3), "lean": _r([400, 700, 380], 11e3)},
            "100mbit": {"auto": _r([700, 690, 720], 86e3), "lean": _r([420, 430, 410], 11e3)}}


def test_the_repeats_judge_the_default_wire_and_auto_s_choice_on_medians():
    out = repeats_summary(_repeats())
    assert out["unshaped_bf16_over_float32"] == pytest.approx(790 / 800)  # medians, not one pass
    assert out["unshaped_bf16_over_float32_by_pass"] == pytest.approx([880 / 900, 620 / 600, 790 / 800])
    assert out["auto_over_lean"] == pytest.approx({"bridge": 720 / 400, "100mbit": 700 / 420})
    assert out["auto_split_off"] == {"bridge": True, "100mbit": True}
    assert out["auto_picks_faster"] is True
    slower = _repeats()
    slower["100mbit"]["lean"] = _r([800, 810, 790], 11e3)  # auto turned the split off where on was faster
    assert repeats_summary(slower)["auto_picks_faster"] is False
    assert repeats_summary({}) == {}


def test_the_repeat_sweeps_run_longer_windows_at_the_fast_points():
    unshaped, fast = network_paths.repeat_sweeps()
    assert unshaped.points == ("bridge",) and set(unshaped.paths) == {"default", "bf16", "auto", "lean"}
    assert fast.points == ("rate=100mbit",) and set(fast.paths) == {"auto", "lean"}
    for s in (unshaped, fast):
        assert s.repeats >= 3 and s.scale is None
        assert s.window[1] - s.window[0] >= 5 * (network_paths.STEPS - network_paths.FIRST)
    args = network_paths._entrypoint_args("d", network_paths.Path("o"), [], 340)
    assert args[args.index("--steps") + 1] == "340"
