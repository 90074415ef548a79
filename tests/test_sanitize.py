"""benchmarks/sanitize.py without a GPU: the plan (every family's fallback chain plus a
sample, or everything) and the parsing of compute-sanitizer output (canned logs)."""
from __future__ import annotations


import pytest

from cc1d.generator import fallback_chain, families, variants
from conftest import benchmark_script

sanitize = benchmark_script("sanitize")


def test_default_plan_covers_every_fallback_chain_and_a_sample():
    rows = sanitize.plan(sample=3)
    by_family: dict[str, set] = {}
    for r in rows:
        by_family.setdefault(r["family"], set()).add(r["variant"])
    fams = [f for f in families() if f.op in sanitize.SHAPES]
    assert set(by_family) == {f.key() for f in fams}
    for f in fams:
        chain = {v.key() for v in fallback_chain(f)}
        assert chain <= by_family[f.key()], f.key()
        space = {v.key() for v in variants(f)}
        assert by_family[f.key()] <= space
        assert len(by_family[f.key()]) == min(len(space), len(chain) + 3)
    assert len(rows) == len({r["variant"] for r in rows})  # no variant twice
    assert sanitize.plan(sample=3) == rows  # seeded


def test_plan_all_is_every_variant_of_the_asked_ops():
    f = next(f for f in families() if f.op == "bwd")
    rows = sanitize.plan(("bwd",), everything=True)
    assert {r["op"] for r in rows} == {"bwd"}
    assert sum(r["family"] == f.key() for r in rows) == sum(1 for _ in variants(f))


CANNED = """\
========= COMPUTE-SANITIZER
CC1D-SANITIZE-VARIANT fwd.cf.bf16wf32.w4.a
CC1D-SANITIZE-VARIANT fwd.cf.bf16wf32.w4.b
========= Invalid __global__ read of size 16 bytes
=========     at cc1d_kernel+0x1a0
=========     by thread (3,0,0) in block (0,0,0)
=========     Address 0x7f0000000100 is out of bounds
=========
========= Invalid __global__ read of size 16 bytes
=========     at cc1d_kernel+0x1a0
CC1D-SANITIZE-VARIANT bwd.cl.f16wf32.w3.c
========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API call to cudaFuncGetAttributes.
=========     Saved host backtrace up to driver entry point at error
========= Uninitialized __global__ memory read of size 4 bytes
=========     at cc1d_reduce+0x70
done; 0 (variant, shape) pairs skipped by requirement
========= ERROR SUMMARY: 4 errors
"""


def test_parse_attributes_reports_to_the_variant_launched_before_them():
    res = sanitize.parse(CANNED)
    assert res["summary_errors"] == 4
    assert res["launched"] == ["fwd.cf.bf16wf32.w4.a", "fwd.cf.bf16wf32.w4.b", "bwd.cl.f16wf32.w3.c"]
    assert res["by_variant"]["fwd.cf.bf16wf32.w4.b"] == ["Invalid __global__ read of size 16 bytes"] * 2
    assert "fwd.cf.bf16wf32.w4.a" not in res["by_variant"]
    assert len(res["by_variant"]["bwd.cl.f16wf32.w3.c"]) == 2
    assert res["unattributed"] == []


def test_summary_counts_kernel_errors_apart_from_api_reports():
    rows = [dict(op="fwd", family="fwd.cf.bf16wf32.w4", variant=k) for k in ("fwd.cf.bf16wf32.w4.a",
                                                                            "fwd.cf.bf16wf32.w4.b")]
    rows.append(dict(op="bwd", family="bwd.cl.f16wf32.w3", variant="bwd.cl.f16wf32.w3.c"))
    s = sanitize.summarize(rows, {"memcheck": dict(sanitize.parse(CANNED), exit_code=0)})
    fwd, bwd = s["fwd"]["tools"]["memcheck"], s["bwd"]["tools"]["memcheck"]
    assert (s["fwd"]["variants"], fwd["launched"], fwd["errors"]) == (2, 2, 2)
    assert fwd["failing"] == [dict(variant="fwd.cf.bf16wf32.w4.b", first="Invalid __global__ read of size 16 bytes",
                                   count=2)]
    assert (bwd["errors"], bwd["api_reports"]) == (1, 1)
    md = sanitize.markdown(s, "cmd")
    assert "| fwd | memcheck | 2 | 2 | 2 | 0 | 4 |" in md


def test_clean_run_parses_to_zero():
    res = sanitize.parse("CC1D-SANITIZE-VARIANT x\n========= ERROR SUMMARY: 0 errors\n")
    assert res == dict(summary_errors=0, by_variant={}, launched=["x"], unattributed=[], not_run=[])


def test_a_variant_no_shape_could_launch_is_not_counted_as_launched():
    log = ("CC1D-SANITIZE-VARIANT fwd.cf.f32wf32.w4.a\nCC1D-SANITIZE-NOT-RUN fwd.cf.f32wf32.w4.a\n"
           "CC1D-SANITIZE-VARIANT fwd.cf.f32wf32.w4.b\n========= ERROR SUMMARY: 0 errors\n")
    rows = [dict(op="fwd", family="fwd.cf.f32wf32.w4", variant=k) for k in ("fwd.cf.f32wf32.w4.a",
                                                                          "fwd.cf.f32wf32.w4.b")]
    s = sanitize.summarize(rows, {"memcheck": dict(sanitize.parse(log), exit_code=0)})
    assert s["fwd"]["tools"]["memcheck"]["launched"] == 1


def test_cover_plan_has_every_chain_and_every_tunable_value_of_each_family():
    from cc1d.generator import space_for
    rows = sanitize.plan(("upd",), cover=True)
    by_family: dict[str, set] = {}
    for r in rows:
        by_family.setdefault(r["family"], set()).add(r["variant"])
    for f in (f for f in families() if f.op == "upd"):
        chosen = [v for v in variants(f) if v.key() in by_family[f.key()]]
        assert {v.key() for v in fallback_chain(f)} <= by_family[f.key()]
        for param in space_for(f).params:
            assert {dict(v.config)[param.name] for v in chosen} == \
                   {dict(v.config)[param.name] for v in variants(f)}, (f.key(), param.name)
    assert len(rows) == len({r["variant"] for r in rows})


def test_shards_keep_families_whole_and_merge_adds_up():
    rows = sanitize.plan(("upd",), sample=2)
    parts = sanitize.shard(rows, 5)
    assert len(parts) == 5 and sorted(map(str, sum(parts, []))) == sorted(map(str, rows))
    owner = {r["family"]: i for i, part in enumerate(parts) for r in part}
    assert all(owner[r["family"]] == i for i, part in enumerate(parts) for r in part)
    merged = sanitize.merge([sanitize.parse(CANNED), sanitize.parse("CC1D-SANITIZE-VARIANT z\n"
                                                                    "========= ERROR SUMMARY: 0 errors\n")])
    assert merged["summary_errors"] == 4 and merged["launched"][-1] == "z"
    assert sanitize.merge([sanitize.parse(CANNED), sanitize.parse("cut off")])["summary_errors"] is None


def test_list_mode_needs_no_gpu(capsys):
    assert sanitize.main(["--list", "--ops", "fwd", "--sample", "1"]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].endswith("families")
    with pytest.raises(SystemExit):
        sanitize.main(["--bogus"])


def test_run_tool_runs_every_shard_at_once_and_joins_their_logs(tmp_path):
    """A stand-in sanitizer (reads the child's plan, prints what compute-sanitizer would): the shards'
    reports all reach the result and the joined log, and the per-shard files are cleaned up."""
    import json
    import sys
    fake = tmp_path / "fake_sanitizer.py"
    fake.write_text(
        "import json, sys\n"
        "rows = json.load(open(sys.argv[-1]))\n"
        "for r in rows:\n"
        "    print('CC1D-SANITIZE-VARIANT ' + r['variant'])\n"
        "    if r['variant'].endswith('bad'):\n"
        "        print('========= Invalid __global__ write of size 4 bytes')\n"
        "print('========= ERROR SUMMARY: %d errors' % sum(r['variant'].endswith('bad') for r in rows))\n"
        "sys.exit(1 if any(r['variant'].endswith('bad') for r in rows) else 0)\n")
    rows = [dict(op="fwd", family=f"fwd.cf.f32wf32.w{w}", variant=f"fwd.cf.f32wf32.w{w}.{s}")
            for w in (2, 3, 4) for s in ("a", "bad" if w == 3 else "b")]
    parts = sanitize.shard(rows, 3)
    for i, part in enumerate(parts):
        (tmp_path / f"plan.{i}.json").write_text(json.dumps(part))
    res = sanitize.run_tool([sys.executable, str(fake)], "memcheck", tmp_path, len(parts), {})
    assert sorted(res["launched"]) == sorted(r["variant"] for r in rows)
    assert res["by_variant"] == {"fwd.cf.f32wf32.w3.bad": ["Invalid __global__ write of size 4 bytes"]}
    assert (res["summary_errors"], res["exit_code"], res["processes"]) == (1, 1, 3)
    assert sorted(p.name for p in tmp_path.glob("memcheck*")) == ["memcheck.log"]
    assert (tmp_path / "memcheck.log").read_text().count("ERROR SUMMARY") == 3
    # --reparse rebuilds the same result from the joined log alone (all but the time)
    again = sanitize.reparse((tmp_path / "memcheck.log").read_text())
    assert {**again, "seconds": res["seconds"]} == res
    (tmp_path / "plan.json").write_text(json.dumps(rows))
    assert sanitize.main(["--reparse", "--tools", "memcheck", "--out", str(tmp_path)]) == 1  # one bad variant
    summary = json.loads((tmp_path / "sanitize.json").read_text())["summary"]
    assert summary["fwd"]["tools"]["memcheck"]["errors"] == 1


def test_reparse_refuses_a_log_it_did_not_join():
    with pytest.raises(ValueError, match="shard"):
        sanitize.reparse("========= ERROR SUMMARY: 0 errors\n")


def test_racecheck_summary_line_counts_errors_and_warnings():
    ok = sanitize.parse("CC1D-SANITIZE-VARIANT x\n========= RACECHECK SUMMARY: 0 hazards displayed "
                        "(0 errors, 0 warnings)\n")
    bad = sanitize.parse("========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)\n")
    assert (ok["summary_errors"], bad["summary_errors"]) == (0, 3)
