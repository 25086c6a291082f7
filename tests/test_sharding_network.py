"""The ``sharding_network`` bench section (bench/sharding/network.py) without an emulated host:
the link reaches the planner's model, the arms' placement files are what the trainer reads, the
order alternates, and the keys are the stated arithmetic on made-up runs."""
from __future__ import annotations

import pytest

from bench.network_paths import combine
from bench.sharding.network import Arm, order, plan_arms, summarize
from gmeta_tf.plan.cost_model import load_cost_model, ratio_error
from gmeta_tf.plan.network import BUSIER_DIRECTION, NetworkCostModel, with_network
from gmeta_tf.plan.placement_file import read_placement
from gmeta_tf.plan.planner import make_plan, step_samples
from gmeta_tf.plan.spec import N_SKEW_BINS, TableStats

pytestmark = pytest.mark.fast

FLAT = (1.0,) + (0.0,) * (N_SKEW_BINS - 1)  # every id read about once
HOT = (0.0,) * (N_SKEW_BINS - 4) + (0.2, 0.3, 0.3, 0.2)  # a few ids read very often
# Tables of very different sizes and access rates, as in the bench's data.
TABLES = [TableStats("item", 20_000, 16, 1.0, FLAT), TableStats("tags", 5_000, 16, 4.0, FLAT),
          TableStats("city", 100, 16, 1.0, HOT), TableStats("hour", 24, 16, 1.0, HOT)]


def test_the_link_rate_reaches_the_planner_and_its_files_are_the_trainers(tmp_path):
    arms = plan_arms(TABLES, 2, 4, 2048, 5_000_000, 2, tmp_path)
    assert list(arms) == ["planner", "greedy", "default"]
    net = with_network(load_cost_model(None), 5_000_000, workers=4, optimizer_slots=2)
    assert isinstance(net, NetworkCostModel)
    kw = dict(cost_model=net, samples_per_step=2048, optimizer_slots=2, seed=0)
    plan = make_plan(TABLES, 2, 8 * 2**30, "planner", **kw)
    assert arms["planner"].predicted_ps_ms == pytest.approx(plan.costs)  # the model told the link
    assert read_placement(arms["planner"].placement) == plan.placement
    greedy = make_plan(TABLES, 2, 8 * 2**30, arms["greedy"].algo, **kw)
    assert read_placement(arms["greedy"].placement) == greedy.placement
    assert arms["greedy"].predicted_ms == pytest.approx(greedy.max_cost)
    assert arms["planner"].predicted_ms <= arms["greedy"].predicted_ms  # seeded from the baselines
    assert arms["planner"].predicted_ms <= arms["default"].predicted_ms  # and from no placement (row_seed)
    # bytes at 5 Mbit/s: the link term, the busier direction's bytes x 8 / rate, is most of each PS's predicted ms
    cpu = load_cost_model(None).ps_costs(plan.shards, 2048)
    link = [1000 * b * BUSIER_DIRECTION * 8 / 5e6 for b in arms["planner"].predicted_ps_payload]
    assert arms["planner"].predicted_ps_ms == pytest.approx([c + x for c, x in zip(cpu, link)])
    assert min(link) > max(cpu)
    # no file for the default: every table row-sharded over every PS, half of every table each
    assert arms["default"].placement is None and arms["default"].sets() == ["hot.budget=0"]
    assert arms["default"].predicted_ps_ms[0] == pytest.approx(arms["default"].predicted_ps_ms[1])
    assert arms["planner"].sets() == ["hot.budget=0", f"cluster.placement={arms['planner'].placement}"]


def test_on_loopback_the_arms_carry_the_cpu_model_only(tmp_path):
    arms = plan_arms(TABLES, 2, 4, 2048, None, 2, tmp_path)
    assert arms["planner"].predicted_ps_payload == []
    plan = make_plan(TABLES, 2, 8 * 2**30, "planner", cost_model=load_cost_model(None), samples_per_step=2048,
                     optimizer_slots=2)
    assert arms["planner"].predicted_ps_ms == pytest.approx(plan.costs)


def test_step_samples_are_every_workers_meta_batch():
    from gmeta_tf.config.loader import load_config

    cfg = load_config("configs/quickstart.yaml", ["data.tasks_per_batch=16"])
    assert step_samples(cfg.data, 4) == 4 * 16 * (16 + 16)


def test_arms_alternate_pass_by_pass():
    assert order(["planner", "greedy", "default"], 0) == ["planner", "greedy", "default"]
    assert order(["planner", "greedy", "default"], 1) == ["default", "greedy", "planner"]


def _run(tps: float, step_ms: float, ps_bytes) -> dict:
    return {"tasks_per_s": tps, "step_ms": step_ms, "busiest_link_kb_per_step": 100.0,
            "wire_bytes_per_step_by_host": {f"ps{i}": b for i, b in enumerate(ps_bytes)}}


def test_the_keys_on_made_up_runs():
    arms = {"planner": Arm("planner", "planner", "p.yaml", [300.0, 290.0], [1000.0, 1000.0]),
            "greedy": Arm("greedy", "size-lookup-greedy", "g.yaml", [400.0, 200.0], [1300.0, 700.0]),
            "default": Arm("default", "row-sharded over every PS", None, [330.0, 330.0], [1100.0, 1100.0])}
    runs = {"planner": [_run(240, 320, [1200, 1100]), _run(220, 360, [1200, 1100])],
            "greedy": [_run(200, 400, [1500, 800]), _run(200, 380, [1500, 800])],
            "default": [_run(210, 350, [1100, 1100]), _run(230, 330, [1100, 1100])]}
    out = summarize(arms, runs)
    # pass by pass: 240/200 - 1 and 220/200 - 1
    assert out["improvement_measured_runs"] == pytest.approx([0.2, 0.1])
    assert out["improvement_measured_mean"] == pytest.approx(0.15)
    assert out["improvement_predicted"] == pytest.approx(400 / 300 - 1)
    assert out["greedy_algo"] == "size-lookup-greedy"
    assert out["arms"]["planner"]["step_ms"] == pytest.approx(340.0)  # median of the runs
    assert out["default_over_greedy"] == pytest.approx(220 / 200 - 1)
    # predicted max-PS ms against the median measured step, arm by arm
    assert out["cost_model_error"] == pytest.approx(ratio_error([300, 400, 330], [340, 390, 340]))
    assert out["link_bytes_ratio"]["planner"] == pytest.approx([1.2, 1.1])
    assert out["link_bytes_ratio"]["greedy"] == pytest.approx([1500 / 1300, 800 / 700])
    assert out["link_bytes_error"] == pytest.approx(ratio_error(
        [1000, 1000, 1300, 700, 1100, 1100], [1200, 1100, 1500, 800, 1100, 1100]))


def test_repeats_combine_host_by_host():
    a = {"tasks_per_s": 1.0, "wire_bytes_per_step_by_host": {"ps0": 10.0, "ps1": 1.0}}
    b = {"tasks_per_s": 3.0, "wire_bytes_per_step_by_host": {"ps0": 30.0, "ps1": 5.0}}
    c = combine([a, b])
    assert c["tasks_per_s"] == 2.0 and c["wire_bytes_per_step_by_host"] == {"ps0": 20.0, "ps1": 3.0}
    assert c["runs_tasks_per_s"] == [1.0, 3.0]
