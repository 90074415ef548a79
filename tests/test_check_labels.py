"""benchmarks/check_labels.py: a moves benchmark's rows are kept where the kernels they name
are what tuner/serving.py says the DBs serve, and left out where not; a sweep's rows are
checked against --after; bad options and files are refused. No GPU: the DBs and rows are
made here from the shipped DB."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from cc1d.tuner.db import TuningDB
from cc1d.tuner.shapes import Shape

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "check_labels.py"
SHIPPED = REPO / "tuning_db" / "sm_90.db"
FAMILY = "fwd.cf.bf16wbf16.w4"
ENTRY = "b8.d5120.l8192.bias.silu"  # left out of "before": its call then takes another entry's kernel


def _run(*argv):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, argv)], capture_output=True, text=True,
                          timeout=300)


def _served(db_path, call):
    from cc1d.tuner.serving import served_winner
    with TuningDB(db_path, readonly=True) as db:
        return served_winner(db, "sm_90", Shape("fwd", "cf", "bf16", "bf16", 4, *call))["variant_key"]


@pytest.fixture(scope="module")
def before(tmp_path_factory):
    """The shipped DB less ENTRY."""
    path = tmp_path_factory.mktemp("dbs") / "before.db"
    shutil.copyfile(SHIPPED, path)
    with closing(sqlite3.connect(path)) as con, con:
        con.execute("DELETE FROM winners WHERE family_key = ? AND shape_key = ?", (FAMILY, ENTRY))
    return path


def _moves(path, rows):
    path.write_text(json.dumps({"arch": "sm_90", "rows": rows}))
    return path


def _row(call, before, after, **kw):
    return dict(family=FAMILY, features="bias,silu", call=list(call), before_variant=before, after_variant=after,
                before_us=10.0, after_us=9.0, **kw)


def test_rows_naming_what_the_dbs_serve_are_kept_the_others_left_out(tmp_path, before):
    midway, other = (8, 5120, 8192), (2, 5120, 2048)
    served_before = _served(before, midway)
    with TuningDB(before, readonly=True) as db:
        wrong_kernel = next(w["variant_key"] for w in db.winners("sm_90")
                            if w["family_key"] == FAMILY and w["variant_key"] != served_before)
    good = _row(midway, served_before, _served(SHIPPED, midway))
    named_wrongly = _row(midway, wrong_kernel, _served(SHIPPED, midway))
    plain = _row(other, _served(before, other), _served(SHIPPED, other))
    sweep = dict(family=FAMILY, features="bias,silu", call=list(other), variant=_served(SHIPPED, other), cc1d_us=5.0)
    moves = _moves(tmp_path / "m.json", [good, named_wrongly, plain, sweep])
    out = tmp_path / "checked.json"
    res = _run(moves, "--before", before, "--after", SHIPPED, "--out", out)
    assert res.returncode == 0, res.stderr
    assert f"{moves}: 3 rows kept, 1 left out" in res.stdout
    assert f"  {FAMILY} {midway}: named {wrong_kernel} -> " in res.stdout
    doc = json.loads(out.read_text())
    assert doc["rows"] == [good, plain, sweep] and doc["arch"] == "sm_90"
    assert doc["labels_checked"] == dict(before=str(before), after=str(SHIPPED), left_out=1)


@pytest.mark.parametrize("text, why", [("not json", "JSONDecodeError"), ('{"arch": "sm_90"}', "KeyError"),
                                       ('{"arch": "sm_90", "rows": [{"family": "x"}]}', "ValueError")])
def test_a_file_that_is_no_benchmarks_json_is_named(tmp_path, text, why):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    res = _run(bad, "--before", SHIPPED, "--after", SHIPPED, "--out", tmp_path / "out.json")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"check_labels.py: {bad} is not the JSON of bench_moves.py or bench_vs_peer.py ({why}" in res.stderr
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: moves, --before, --after, --out"),
    (["/nonexistent/m.json", "--before", SHIPPED, "--after", SHIPPED, "--out", "/tmp/x.json"],
     "moves: no such file '/nonexistent/m.json'"),
    ([__file__, "--before", "/nonexistent/b.db", "--after", SHIPPED, "--out", "/tmp/x.json"],
     "--before: no such file '/nonexistent/b.db'"),
    ([__file__, "--before", SHIPPED, "--after", SHIPPED, "--out", __file__],
     f"--out: expected a new file, got '{__file__}', which exists"),
])
def test_bad_options_are_refused(argv, message):
    res = _run(*argv)
    assert res.returncode == 2 and message in res.stderr, res.stderr
