"""hipRTC: the covering set compiles for gfx942 and gfx90a through cc1d's own HIP
backend, in a subprocess under Debian 13's hipRTC 5.7 (../shared/tools/rocm-trixie.sh).
AMD kernels are only compiled here, never run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import pythonpath_with
from cc1d.generator.covering import all_covering

from cc1d.generator import default_variant, families

pytestmark = pytest.mark.amd
WORKER = Path(__file__).with_name("amd_compile_worker.py")
# gfx942 (MI300) is the AMD target; gfx90a (MI200) compiles its covering sets too with
# --all-variants (they double the AMD compile time of a CPU-only CI run).
AMD_TARGETS = ["gfx942", pytest.param("gfx90a", marks=pytest.mark.all_variants)]
DEFAULT_KEYS = {default_variant(f, t).key() for f in families() for t in ("gfx942", "gfx90a")}


def _compile_batch(script, target, variants):
    """Results in the order of `variants`. hipRTC compiles one source at a time per process
    (a global lock), so the batch is split over one worker process per core."""
    n = max(1, min(os.cpu_count() or 2, len(variants)))
    parts = [variants[i::n] for i in range(n)]

    def run(part):
        payload = json.dumps([dict(key=v.key(), source=v.source) for v in part])
        proc = subprocess.run(["bash", str(script), "run", "--", sys.executable, str(WORKER), target],
                              input=payload, capture_output=True, text=True, timeout=1800,
                              env={**os.environ, "PYTHONPATH": pythonpath_with(WORKER.parent)})
        assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        return json.loads(proc.stdout)

    with ThreadPoolExecutor(n) as pool:
        by_key = {r["key"]: r for results in pool.map(run, parts) for r in results}
    return [by_key[v.key()] for v in variants]


@pytest.mark.parametrize("target", AMD_TARGETS)
def test_covering_set_compiles_for_amd(trixie, target):
    chosen = all_covering(target)
    # Tuning candidates may spill (the tuner times them); the untuned ones may not.
    results = compile_for_amd(trixie, target, chosen, no_scratch=DEFAULT_KEYS)
    assert len(results) == len(chosen)
    missing = [r["key"] for r in results if "vgpr_spill_count" not in r["resources"]]
    assert not missing, f"no resource metadata in the code objects of {missing[:5]}"


def _assert_no_scratch(results):
    # SGPR spills go to VGPR lanes (no memory); VGPR spills and scratch would be local memory.
    spills = [f"{r['key']}: {r['resources']}" for r in results
              if r["resources"]["vgpr_spill_count"] or r["resources"].get("private_segment_fixed_size")]
    assert not spills, "scratch use (spills):\n" + "\n".join(spills)


def compile_for_amd(script, target, variants, no_scratch=None):
    """Compiles `variants` (anything with key() and source) for `target` through hipRTC
    and fails unless every one compiles and none of `no_scratch` (keys; every variant when
    None) uses scratch. Returns the results in the order of `variants`."""
    results = _compile_batch(script, target, variants)
    failed = [f"{r['key']}: {r['log'][-1500:]}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    _assert_no_scratch(results if no_scratch is None else [r for r in results if r["key"] in no_scratch])
    return results


def test_defaults_compile_for_gfx942_without_scratch(trixie):
    defaults = [default_variant(f, "gfx942") for f in families()]
    compile_for_amd(trixie, "gfx942", defaults)


def test_tuner_compile_only_for_gfx942(trixie, tmp_path):
    """`cc1d-tune --arch gfx942 --compile-only`: the AMD route on machines without an AMD GPU."""
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text("shapes:\n  - {layout: [cf, cl], dtypes: bf16/f32, width: 4, batch: 2, dim: 256, "
                      "seqlen: 1000}\n")
    proc = subprocess.run(["bash", str(trixie), "run", "--", sys.executable, "-P", "-m", "cc1d.tuner",
                           "--arch", "gfx942", "--compile-only", "--trials", "3", "--shapes", str(shapes)],
                          capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gfx942" in proc.stdout + proc.stderr
