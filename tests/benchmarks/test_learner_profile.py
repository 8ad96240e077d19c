"""benchmarks/learner_profile.py: the wall-share arithmetic and a real profile of the tiny model."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import learner_profile  # noqa: E402


def test_wall_shares_split_overlapping_time_evenly():
    events = [{"ts": 0, "dur": 10}, {"ts": 5, "dur": 10}, {"ts": 30, "dur": 2}]
    # [0,5): first alone; [5,10): both; [10,15): second alone; gap; [30,32): third.
    assert learner_profile.wall_shares(events) == [7.5, 7.5, 2.0]


def test_hlo_ops_and_kinds():
    text = ('  %ynn_fusion.3 = f32[8,16]{1,0} fusion(%a), kind=kCustom, '
            'metadata={op_name="jit(loss)/jvp(btd,df->btf)/dot_general"}\n'
            '  ROOT %add_convert_fusion = bf16[8]{0} fusion(%b), kind=kLoop\n')
    ops = learner_profile.hlo_ops(text)
    assert ops == {"ynn_fusion.3": ("f32[8,16]", "jit(loss)/jvp(btd,df->btf)/dot_general"),
                   "add_convert_fusion": ("bf16[8]", "")}
    assert learner_profile.kind("ynn_fusion.3", ops["ynn_fusion.3"][1]) == "decoder products"
    assert learner_profile.kind("ynn_fusion.9", "x/while/body/dot_general") == "head products"
    assert learner_profile.kind("ynn_fusion.9", "x/transpose(jvp())/cond/branch_0_fun/dot") == \
        "decoder weight gradients"
    assert learner_profile.kind("copy_fusion", "") == "elementwise and copies"


@pytest.mark.slow
def test_profile_of_the_tiny_model_accounts_for_the_step():
    by_kind, rows = learner_profile.profile("tiny", "mixed_bf16head", steps=2)
    assert by_kind["decoder products"] > 0 and by_kind["head products"] > 0
    assert sum(by_kind.values()) == pytest.approx(sum(r[0] for r in rows), rel=0.02)
    assert all(n >= 1 for _, n, *_ in rows)
