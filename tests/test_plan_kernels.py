"""Which kernel plans launch, as the tuner asks it (fwd_plan_fixes, bwd_plan_fixes,
upd_plan_fixes): the forward's fixed kernel for channel-last calls and channel-first ones
from width 5, the backward's for channel-last calls, the update's always, none with
CC1D_FWD_GENERIC=1 / CC1D_BWD_GENERIC=1 / CC1D_UPD_GENERIC=1. The tuner's problems time
that kernel (launch_fwd / launch_bwd / launch_upd as_plan): test_tuner_plan_gpu.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cc1d.generator import families

from test_bwd_fixed_compile import fixed_bwd_call
from test_fwd_fixed_compile import fixed_call
from test_upd_compile import UPD
from test_upd_compile import fixed_call as upd_fixed_call


def _fwd_family(layout, width):
    return next(f for f in families("fwd") if (f.layout, f.x_dtype, f.w_dtype, f.width) ==
                (layout, "bf16", "bf16", width))


def test_forward_plans_fix_channel_last_wide_channel_first_and_seq_idx_calls(rt):
    assert rt.fwd_plan_fixes(*fixed_call(_fwd_family("cl", 2)))
    assert rt.fwd_plan_fixes(*fixed_call(_fwd_family("cl", 4), row_pad=8))
    assert not rt.fwd_plan_fixes(*fixed_call(_fwd_family("cf", 4)))
    assert not rt.fwd_plan_fixes(*fixed_call(_fwd_family("cf", 2), initial_states=True, final_states=True))
    assert rt.fwd_plan_fixes(*fixed_call(_fwd_family("cf", 4), seq_idx=True))
    assert rt.fwd_plan_fixes(*fixed_call(_fwd_family("cf", 2), seq_idx=True))
    assert rt.fwd_plan_fixes(*fixed_call(_fwd_family("cf", 5)))
    assert rt.fwd_plan_fixes(*fixed_call(_fwd_family("cf", 8)))


def _bwd_family(layout, width=4):
    return next(f for f in families("bwd") if (f.layout, f.x_dtype, f.w_dtype, f.width) ==
                (layout, "bf16", "bf16", width))


def test_backward_plans_fix_channel_last_calls(rt):
    assert rt.bwd_plan_fixes(*fixed_bwd_call(_bwd_family("cl", 2)))
    assert rt.bwd_plan_fixes(*fixed_bwd_call(_bwd_family("cl"), row_pad=8, seq_idx=True, dfinal_states=True))
    assert not rt.bwd_plan_fixes(*fixed_bwd_call(_bwd_family("cf")))
    assert not rt.bwd_plan_fixes(*fixed_bwd_call(_bwd_family("cf", 8), seq_idx=True))


def test_update_plans_fix_every_call(rt):
    assert rt.upd_plan_fixes(*upd_fixed_call(UPD[0]))
    assert rt.upd_plan_fixes(*upd_fixed_call(UPD[-1], indices=True, bias=False))


def test_plan_fixes_checks_the_call(rt):
    args = list(fixed_call(_fwd_family("cl", 4)))
    args[1] = (3, 664, 1000, 9)  # width 9
    with pytest.raises(ValueError, match="width"):
        rt.fwd_plan_fixes(*args)
    args = list(upd_fixed_call(UPD[0]))
    args[1] = (4, 640, 1, 3, 6, 9)  # width 9
    with pytest.raises(ValueError, match="width"):
        rt.upd_plan_fixes(*args)
    args = list(fixed_bwd_call(_bwd_family("cl")))
    args[1] = (3, 664, 1000, 9)  # width 9
    with pytest.raises(ValueError, match="width"):
        rt.bwd_plan_fixes(*args)


def test_generic_switches_turn_plans_generic(tmp_path):
    """The switches are read once per process: each setting in a fresh one."""
    calls = json.dumps([fixed_call(_fwd_family("cl", 4)), fixed_bwd_call(_bwd_family("cl")), upd_fixed_call(UPD[0])])
    script = ("import json, sys\n"
              "from cc1d._runtime import runtime\n"
              "fwd, bwd, upd = json.loads(sys.argv[1])\n"
              "rt = runtime()\n"
              "print(json.dumps([rt.fwd_plan_fixes(*fwd), rt.bwd_plan_fixes(*bwd), rt.upd_plan_fixes(*upd)]))\n")

    def fixes(**env):
        switches = ("CC1D_FWD_GENERIC", "CC1D_BWD_GENERIC", "CC1D_UPD_GENERIC")
        clean = {k: v for k, v in os.environ.items() if k not in switches}
        run = subprocess.run([sys.executable, "-P", "-c", script, calls], capture_output=True, text=True,
                             cwd=tmp_path, env={**clean, **env}, timeout=120)
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout.splitlines()[-1])

    assert fixes() == [True, True, True]
    assert fixes(CC1D_FWD_GENERIC="1") == [False, True, True]
    assert fixes(CC1D_BWD_GENERIC="1") == [True, False, True]
    assert fixes(CC1D_UPD_GENERIC="1") == [True, True, False]
