"""bench/hlo_compare.py counts what an optimized HLO module holds: a two-computation module
written by hand, so a miscount (a fused body's dot counted at the top level, a reducer's add
counted as a kernel) fails here rather than in docs/profile.md's table."""
from bench.hlo_compare import counts, dots, summary

HLO = """HloModule jit_step, entry_computation_layout={(f32[4,8]{1,0})->f32[4]{0}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.1 = f32[] add(f32[] %a, f32[] %b)
}

%fused_computation (p0: f32[4,8], p1: f32[8,8]) -> f32[4,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  %dot.2 = f32[4,8]{1,0} dot(f32[4,8]{1,0} %p0, f32[8,8]{1,0} %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %tanh.3 = f32[4,8]{1,0} tanh(f32[4,8]{1,0} %dot.2)
}

ENTRY %main.9 (Arg_0.1: f32[4,8], Arg_1.2: f32[2,4,8]) -> (f32[4], f32[8,4]) {
  %Arg_0.1 = f32[4,8]{1,0} parameter(0)
  %Arg_1.2 = f32[2,4,8]{2,1,0} parameter(1)
  %constant.4 = f32[8,8]{1,0} constant({...})
  %fusion = f32[4,8]{1,0} fusion(f32[4,8]{1,0} %Arg_0.1, f32[8,8]{1,0} %constant.4), kind=kOutput, calls=%fused_computation
  %dot.5 = f32[2,4,4]{2,1,0} dot(f32[2,4,8]{2,1,0} %Arg_1.2, f32[2,4,8]{2,1,0} %Arg_1.2), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={2}
  %transpose.6 = f32[8,4]{1,0} transpose(f32[4,8]{1,0} %fusion), dimensions={1,0}
  %constant.7 = f32[] constant(0)
  %reduce.8 = f32[4]{0} reduce(f32[4,8]{1,0} %fusion, f32[] %constant.7), dimensions={1}, to_apply=%add
  ROOT %tuple.9 = (f32[4]{0}, f32[8,4]{1,0}) tuple(f32[4]{0} %reduce.8, f32[8,4]{1,0} %transpose.6)
}
"""


def test_counts_tell_fused_bodies_and_reducers_from_the_top_level(tmp_path):
    path = tmp_path / "module_0001.jit_step.cpu_after_optimizations.txt"
    path.write_text(HLO)
    c = counts(str(path))
    assert c["instructions"] == 3 + 4 + 9
    assert c["top_level"] == 9  # the entry only: the fused body and the reducer are not kernels
    assert c["top_level_ops"] == 4  # fusion, dot, transpose, reduce
    assert c["fusions"] == 1 and c["fusion_kinds"] == "Output 1"
    assert c["unfused_ops"] == 3
    assert c["top_level_mb"] == round((4 * 8 + 2 * 4 * 4 + 8 * 4 + 4) * 4 / 1e6, 2)  # fusion, dot, transpose, reduce
    assert (c["dots"], c["dots_top_level"], c["dots_batched"]) == (2, 1, 1)
    assert c["transpose"] == 1 and c["reduce"] == 1 and c.get("copy", 0) == 0
    assert (c["entry_parameters"], c["entry_outputs"]) == (2, 2)
    listed = dots(str(path))
    assert len(listed) == 2 and "lhs_batch_dims={0}" in listed[1] and "f32[2,4,8]" in listed[1]
    (tmp_path / "module_0001.jit_step.cpu_after_optimizations-buffer-assignment.txt").write_text("x")
    assert summary(str(tmp_path))["modules"] == 1  # reports beside the module are not modules
