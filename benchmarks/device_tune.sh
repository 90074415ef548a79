#!/usr/bin/env bash
# On the GPU machine: a guarded cc1d-tune run of a shapes file, started from and guarded by
# this checkout's shipped DB (tuning_db/<arch>.db), merged into that DB there, the gpu tests
# of the variants the merge adds (benchmarks/new_variants.py), and the calls the merge moved
# (the new entries' own first) timed through the DB before and after and the peer
# (benchmarks/bench_moves.py: at most MOVES_MAX calls, 0 skipping it; where MOVES_S is set,
# none started after that many seconds; a run whose merge moves more calls than MOVES_MAX,
# as merge.log says, leaves the rest untimed: raise it or time them in a call of their own,
# as session 77 did; MOVES_BEFORE=DB times them against DB instead of the shipped DB as the run
# found it, say the DB from before winners were dropped to be re-tuned after a template change,
# tuning_db/README.md). $OUT (default /tmp/cc1d-out) gets at most seven
# files, fewer than the device tool's eight: tune.log, tune.db (the run's own DB), merge.log,
# tests.log, moves.log, moves.json and slowed.yaml (the calls the merge slowed, as a shapes
# file for the next run; only where some did). The eight count every file under the call's
# $OUT, subfolders included: a call that writes more than one file beside these loses some
# (session 78's seq_idx run, in a subfolder beside five others, came back without its
# tune.log). Then, on
# the CPU machine, as tuning_db/README.md says:
#   cc1d-tune db merge --db tuning_db/sm_90.db tune.db; cc1d-tune db finalize --drop-trials ...;
#   cc1d-tune db validate --compile ...; and add the shapes the guard printed to the shapes file.
# The merge here is never shipped: it serves only the tests and the timing.
# START_FROM="DB ..." adds start DBs after the shipped one (say the DB that served the calls
# before a change, whose configs the shipped DB no longer holds: session 80; a shape's own
# winner in any of them is still tried first, tuner/search.py start_configs); the tuner runs
# from /tmp, so each is made absolute here, and a missing one is refused before the build. A
# --start-from among the cc1d-tune args replaces the shipped DB as start (the tuner takes the
# last), so its paths must be absolute.
#   [DEADLINE_S=300] [TRIALS=24] [BUDGET_S=30] [MOVES_MAX=40] [MOVES_S=] [MOVES_BEFORE=] [START_FROM=] bash benchmarks/device_tune.sh SHAPES.yaml [cc1d-tune args...]
# e.g. bash benchmarks/device_tune.sh slowed.yaml --ops bwd --guard-max-calls 24
set -uo pipefail
export PYTHONUNBUFFERED=1
[ $# -ge 1 ] && [ -f "$1" ] || { echo "device_tune.sh: expected a shapes file as the first argument, got '${1:-}'" >&2
                                 exit 2; }
SHAPES=$(realpath "$1"); shift
if [ -n "${MOVES_BEFORE:-}" ]; then
  [ -f "$MOVES_BEFORE" ] || { echo "device_tune.sh: MOVES_BEFORE: expected a tuning DB file, got '$MOVES_BEFORE' (no such file)" >&2
                              exit 2; }
  MOVES_BEFORE=$(realpath "$MOVES_BEFORE")
fi
STARTS=()
for db in ${START_FROM:-}; do
  [ -f "$db" ] || { echo "device_tune.sh: START_FROM: expected tuning DB files, got '$db' (no such file)" >&2
                    exit 2; }
  STARTS+=("$(realpath "$db")")
done
in_starts=0
for arg in "$@"; do
  case "$arg" in
    --start-from) in_starts=1;;
    -*) in_starts=0;;
    /*) ;;
    *) [ "$in_starts" = 1 ] && { echo "device_tune.sh: --start-from: expected absolute paths (the tuner runs from" \
                                      "/tmp), got '$arg'; or pass it in START_FROM" >&2; exit 2; };;
  esac
done
OUT=${OUT:-/tmp/cc1d-out}; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
REPO=$(pwd)
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
source benchmarks/device_setup.sh  # optuna from .whl/, build_cc1d
build_cc1d
ARCH=$(python3 -P -c 'import torch; from cc1d._runtime import runtime; print(runtime().device_target("cuda", 0))') \
  || { echo "device_tune.sh: no CUDA device's target" >&2; exit 1; }
DB="$REPO/tuning_db/$ARCH.db"
[ -f "$DB" ] || { echo "device_tune.sh: no shipped DB $DB for this device's arch" >&2; exit 1; }
say "built; $ARCH, shipped DB $DB"
BEFORE=$(mktemp -d)/before.db; cp "$DB" "$BEFORE"
# From /tmp with -P: the checkout's cc1d/ folder lacks the compiled runtime.
(cd /tmp && python3 -P -m cc1d.tuner --shapes "$SHAPES" --db "$OUT/tune.db" --trials "${TRIALS:-24}" \
   --budget-s "${BUDGET_S:-30}" --start-from "$DB" ${STARTS[@]+"${STARTS[@]}"} --guard "$DB" --guard-rounds 1 \
   --deadline-s "${DEADLINE_S:-300}" "$@") >"$OUT/tune.log" 2>&1
status=$?
tail -30 "$OUT/tune.log"
say "tuned (status $status)"
[ -f "$OUT/tune.db" ] || exit 1
# Merged from a copy (with the -wal a killed run may leave), so that $OUT's file comes back as
# the run left it, with no file of a reader's beside it.
RUN=$(mktemp -d); cp "$OUT"/tune.db* "$RUN"/
# Finalized too, so that the package's copy is one file, as the shipped DB is.
{ python3 -P -m cc1d.tuner db merge --db "$DB" "$RUN/tune.db" && python3 -P -m cc1d.tuner db finalize --db "$DB"; } \
  >"$OUT/merge.log" 2>&1 || { cat "$OUT/merge.log"; exit 1; }
head -3 "$OUT/merge.log"
# Without -P: the script imports its sibling script_exit.py from its own folder (which holds
# no cc1d/, so the installed package is the one imported).
KEYS=$(python3 benchmarks/new_variants.py "$BEFORE" "$DB") || exit 1
if [ -z "$KEYS" ]; then
  echo "no variant new in the DB: no variant tests to run" | tee "$OUT/tests.log"
else
  echo "new variants: $KEYS"
  build_cc1d  # the package's copy of the DB, for the dispatcher
  python3 -P -m pytest -q -m gpu -p no:cacheprovider tests/test_forward_gpu.py tests/test_fwd_fixed_gpu.py \
    tests/test_backward_gpu.py tests/test_bwd_seq_gpu.py tests/test_realign.py -k "$KEYS" >/tmp/cc1d-tests.log 2>&1 \
    || status=1  # a failed test fails the run, after the moves are timed
  tail -15 /tmp/cc1d-tests.log | tee "$OUT/tests.log"
  say tested
fi
# What decides whether the run ships: its guard times at most --guard-max-calls moves (one
# of session 70's runs left 107 of its 123 untimed).
if [ "${MOVES_MAX:-40}" -gt 0 ]; then
  install_peer device_tune.sh
  rm -f "$OUT/slowed.yaml"  # a new file for --shapes-out, where $OUT is reused
  python3 benchmarks/bench_moves.py --before "${MOVES_BEFORE:-$BEFORE}" --after "$DB" --entries --max-calls "${MOVES_MAX:-40}" \
    ${MOVES_S:+--deadline-s "$MOVES_S"} --out "$OUT/moves.json" --shapes-out "$OUT/slowed.yaml" \
    >"$OUT/moves.log" 2>&1 || status=1
  grep -A30 "^| family | served after" "$OUT/moves.log" | tail -n +3
  tail -2 "$OUT/moves.log"
  say "moves timed"
fi
exit "$status"
