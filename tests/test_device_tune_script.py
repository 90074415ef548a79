"""benchmarks/device_tune.sh (a guarded tuning run on the GPU machine) parses, refuses a
missing shapes file before touching anything, names test modules that exist and leaves at
most eight files in $OUT; START_FROM's DBs and MOVES_BEFORE reach the tuner and the timing,
missing ones (and relative --start-from paths) refused first; it and device_check.sh share
device_setup.sh; benchmarks/new_variants.py names the variants a DB change adds."""
from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_tune.sh"
NEW_VARIANTS = ROOT / "benchmarks" / "new_variants.py"
SHIPPED = ROOT / "tuning_db" / "sm_90.db"


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_the_device_scripts_take_their_setup_from_one_file():
    setup = ROOT / "benchmarks" / "device_setup.sh"
    subprocess.run(["bash", "-n", str(setup)], check=True)
    for name in ("device_tune.sh", "device_check.sh"):
        text = (ROOT / "benchmarks" / name).read_text()
        assert "source benchmarks/device_setup.sh" in text and "build_cc1d" in text, name
        assert "pip install" not in text, name  # none of its own


def test_a_missing_shapes_file_is_refused_first(tmp_path):
    res = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "none.yaml")], capture_output=True, text=True,
                         cwd=ROOT, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")}, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"expected a shapes file as the first argument, got '{tmp_path / 'none.yaml'}'" in res.stderr
    assert not (tmp_path / "out").exists()


def test_its_test_modules_exist_and_its_files_fit_the_limit():
    text = SCRIPT.read_text()
    modules = re.findall(r"tests/(test_\w+\.py)", text)
    assert len(modules) == 5 and all((ROOT / "tests" / m).is_file() for m in modules)
    files = set(re.findall(r'"\$OUT/([\w.]+)"', text))
    assert files == {"tune.log", "tune.db", "merge.log", "tests.log", "moves.log", "moves.json", "slowed.yaml"}


def _without(tmp_path, *variant_keys: str) -> Path:
    """The shipped DB less every winner of these variants."""
    path = tmp_path / "before.db"
    shutil.copyfile(SHIPPED, path)
    with closing(sqlite3.connect(path)) as con, con:
        con.executemany("DELETE FROM winners WHERE variant_key = ?", [(k,) for k in variant_keys])
    return path


def _run(*argv):
    """new_variants.py, run with the interpreter options device_tune.sh gives it (session 70's
    first device run found it could not import its sibling script under -P)."""
    found = re.search(r"python3((?: -\w+)*) benchmarks/new_variants\.py", SCRIPT.read_text())
    assert found, "device_tune.sh no longer runs benchmarks/new_variants.py"
    return subprocess.run([sys.executable, *found.group(1).split(), str(NEW_VARIANTS), *map(str, argv)],
                          capture_output=True, text=True, timeout=60)


def test_new_variants_names_the_variants_only_the_after_db_holds(tmp_path):
    with closing(sqlite3.connect(f"file:{SHIPPED}?mode=ro", uri=True)) as con:
        counts = Counter(r[0] for r in con.execute("SELECT variant_key FROM winners"))
    single = sorted(k for k, n in counts.items() if n == 1)[:2]
    assert len(single) == 2
    before = _without(tmp_path, *single)
    res = _run(before, SHIPPED)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"{single[0]} or {single[1]}\n"
    assert _run(SHIPPED, before).stdout == ""  # dropping winners adds no variant


def test_new_variants_refuses_missing_or_unreadable_dbs(tmp_path):
    res = _run(tmp_path / "none.db", SHIPPED)
    assert res.returncode == 2 and "before: no such file" in res.stderr
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite")
    res = _run(SHIPPED, junk)
    assert res.returncode == 2 and "new_variants.py: tuning DB" in res.stderr and "junk.db" in res.stderr


def test_the_setup_installs_the_wheels_then_the_checkout_then_the_peer(tmp_path):
    """device_setup.sh's commands, through a python3 that only records them."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncase "$*" in *--no-build-isolation*) exit "$BUILD_FAILS";; esac\n')
    fake.chmod(0o755)
    work = tmp_path / "work"
    (work / ".whl").mkdir(parents=True)
    (work / ".whl" / "optuna-5.0.0-py3-none-any.whl").write_text("")
    (work / ".peer").mkdir()
    (work / ".peer" / "causal_conv1d-1.7.0-cp312-cp312-linux_x86_64.whl").write_text("")
    setup = ROOT / "benchmarks" / "device_setup.sh"
    script = f'set -u; source {setup}; build_cc1d; install_peer test; echo "PYTHONPATH=$PYTHONPATH"'
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "BUILD_FAILS": "0"}
    res = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "PYTHONPATH=/tmp/site" in res.stdout, res.stdout + res.stderr
    got = calls.read_text().splitlines()
    assert len(got) == 3
    assert got[0].startswith("-m pip install -q --no-index") and got[0].endswith(".whl/optuna-5.0.0-py3-none-any.whl")
    assert got[1] == "-m pip install -q --no-build-isolation --no-deps ."
    assert got[2] == "-m pip install -q --no-deps .peer/causal_conv1d-1.7.0-cp312-cp312-linux_x86_64.whl"
    calls.unlink()
    res = subprocess.run(["bash", "-c", script], cwd=work, env={**env, "BUILD_FAILS": "1"}, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and "PYTHONPATH" not in res.stdout  # a failed build stops the script there


def _fake_run(tmp_path, new_keys: str, *args: str, **env_extra) -> tuple[subprocess.CompletedProcess, list[str]]:
    """device_tune.sh in a stand-in checkout, through a python3 that records its commands and
    plays each one's part: the arch, a run's DB, the merge, new_variants.py's keys."""
    calls, out, work = tmp_path / "calls", tmp_path / "out", tmp_path / "work"
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
case "$*" in
  "-P -c "*) echo sm_90;;
  "-P -m cc1d.tuner --shapes"*) : > {out}/tune.db;;
  "benchmarks/new_variants.py"*) [ -n "$NEW_KEYS" ] && echo "$NEW_KEYS";;
  "benchmarks/bench_moves.py"*) echo "| family | served after by the entry |"; echo "1 calls timed";;
  "-P -m pytest"*) exit "${{TESTS_FAIL:-0}}";;
esac
exit 0
""")
    fake.chmod(0o755)
    (work / "benchmarks").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "device_setup.sh", work / "benchmarks")
    (work / "tuning_db").mkdir()
    (work / "tuning_db" / "sm_90.db").write_text("")
    (work / "s.yaml").write_text("shapes: []\n")
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "OUT": str(out), "NEW_KEYS": new_keys, **env_extra}
    res = subprocess.run(["bash", str(SCRIPT), "s.yaml", "--ops", "bwd", *args], cwd=work, env=env,
                         capture_output=True, text=True, timeout=60)
    return res, calls.read_text().splitlines()


def _step(calls: list[str], start: str) -> int:
    return next(i for i, c in enumerate(calls) if c.startswith(start))


def test_the_run_is_merged_tested_then_its_moves_timed(tmp_path):
    res, calls = _fake_run(tmp_path, "bwd.cf.x or bwd.cf.y")
    assert res.returncode == 0, res.stdout + res.stderr
    tune, merge = _step(calls, "-P -m cc1d.tuner --shapes"), _step(calls, "-P -m cc1d.tuner db merge")
    tests, moves = _step(calls, "-P -m pytest"), _step(calls, "benchmarks/bench_moves.py")
    assert tune < merge < tests < moves
    assert calls[tune].endswith("--ops bwd") and '-k bwd.cf.x or bwd.cf.y' in calls[tests]
    work, out = tmp_path / "work", tmp_path / "out"
    assert re.fullmatch(rf"benchmarks/bench_moves.py --before \S+/before.db --after {work}/tuning_db/sm_90.db "
                        rf"--entries --max-calls 40 --out {out}/moves.json --shapes-out {out}/slowed.yaml", calls[moves])


def test_the_moves_are_timed_where_no_variant_is_new_and_skipped_with_moves_max_0(tmp_path):
    res, calls = _fake_run(tmp_path / "a", "")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not any(c.startswith("-P -m pytest") for c in calls)
    assert "no variant tests to run" in (tmp_path / "a" / "out" / "tests.log").read_text()
    assert any(c.startswith("benchmarks/bench_moves.py") for c in calls)
    res, calls = _fake_run(tmp_path / "b", "", MOVES_MAX="0")
    assert res.returncode == 0 and not any(c.startswith("benchmarks/bench_moves.py") for c in calls)


def test_moves_s_gives_the_moves_a_deadline(tmp_path):
    res, calls = _fake_run(tmp_path, "", MOVES_S="90")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "--max-calls 40 --deadline-s 90 --out" in calls[_step(calls, "benchmarks/bench_moves.py")]


def test_a_failed_variant_test_fails_the_run_after_its_moves_are_timed(tmp_path):
    res, calls = _fake_run(tmp_path, "bwd.cf.x", TESTS_FAIL="1")
    assert res.returncode == 1, res.stdout + res.stderr
    assert any(c.startswith("benchmarks/bench_moves.py") for c in calls)


def test_moves_before_times_the_moves_against_another_db(tmp_path):
    """MOVES_BEFORE: the moves are timed against that DB (say the one from before winners were
    dropped to be re-tuned), not the copy of the shipped DB the run started from."""
    before = tmp_path / "start.db"
    before.write_text("")
    res, calls = _fake_run(tmp_path, "", MOVES_BEFORE=str(before))
    assert res.returncode == 0, res.stdout + res.stderr
    assert calls[_step(calls, "benchmarks/bench_moves.py")].startswith(f"benchmarks/bench_moves.py --before {before} ")


def test_a_missing_moves_before_db_is_refused_before_the_build(tmp_path):
    (tmp_path / "s.yaml").write_text("shapes: []\n")
    res = subprocess.run(["bash", str(SCRIPT), "s.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"),
                              "MOVES_BEFORE": str(tmp_path / "nope.db")})
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"MOVES_BEFORE: expected a tuning DB file, got '{tmp_path / 'nope.db'}' (no such file)" in res.stderr
    assert not (tmp_path / "out").exists()


def test_start_from_adds_start_dbs_after_the_shipped_one_as_absolute_paths(tmp_path):
    """The tuner runs from /tmp: START_FROM's DBs reach it as absolute paths, after the shipped DB
    (which stays the first start, the one the report's "vs start" refers to)."""
    (tmp_path / "work" / "old").mkdir(parents=True)
    for name in ("a.db", "b.db"):
        (tmp_path / "work" / "old" / name).write_text("")
    res, calls = _fake_run(tmp_path, "", START_FROM="old/a.db old/b.db")
    assert res.returncode == 0, res.stdout + res.stderr
    work = tmp_path / "work"
    assert (f"--start-from {work}/tuning_db/sm_90.db {work}/old/a.db {work}/old/b.db --guard "
            in calls[_step(calls, "-P -m cc1d.tuner --shapes")])
    res, calls = _fake_run(tmp_path / "abs", "", "--start-from", f"{work}/old/a.db", "--trials", "8")
    assert res.returncode == 0, res.stdout + res.stderr  # absolute paths among the args pass
    assert calls[_step(calls, "-P -m cc1d.tuner --shapes")].endswith(f"--start-from {work}/old/a.db --trials 8")


def test_missing_start_dbs_and_relative_start_from_paths_are_refused_before_the_build(tmp_path):
    (tmp_path / "s.yaml").write_text("shapes: []\n")
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")}
    res = subprocess.run(["bash", str(SCRIPT), "s.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**env, "START_FROM": "nope.db"})
    assert res.returncode == 2, res.stdout + res.stderr
    assert "START_FROM: expected tuning DB files, got 'nope.db' (no such file)" in res.stderr
    (tmp_path / "old.db").write_text("")
    res = subprocess.run(["bash", str(SCRIPT), "s.yaml", "--ops", "bwd", "--start-from", str(tmp_path / "old.db"),
                          "old.db", "--trials", "8"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--start-from: expected absolute paths (the tuner runs from /tmp), got 'old.db'" in res.stderr
    assert not (tmp_path / "out").exists()  # refused before anything ran
