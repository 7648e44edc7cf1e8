#!/usr/bin/env bash
# signal_a_rank.sh MPIRUN SIGNAL READY PATTERN NUMESH ARGS...: starts `mpirun -np 2 NUMESH
# ARGS...`, waits until its output has a line matching READY (grep -E: the work has started,
# past MPI's start-up), sends SIGNAL to rank 1 a second later (mid-run: ARGS should run for
# longer), and expects every rank to end within 60 s, mpirun exiting with a non-zero status and
# its output matching PATTERN. KILL: a rank that dies; STOP: a rank that hangs without dying.
# Exit 0 when it does, 1 otherwise (with the output).
set -u
mpirun="$1"
signal="$2"
ready="$3"
pattern="$4"
shift 4
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$mpirun" -np 2 --oversubscribe --bind-to none "$@" >"$log" 2>&1 &
launcher=$!
victim=""
for _ in $(seq 1 300); do
  # mpirun's children (read from /proc: no procps needed), the one whose rank is 1.
  for stat in /proc/[0-9]*/stat; do
    read -r child _ _ parent _ <"$stat" 2>/dev/null || continue
    [[ "$parent" == "$launcher" ]] || continue
    if tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then
      victim="$child"
    fi
  done
  [[ -n "$victim" ]] && break
  sleep 0.1
done
if [[ -z "$victim" ]]; then
  kill "$launcher" 2>/dev/null
  echo "rank 1 never started"; cat "$log"; exit 1
fi
for _ in $(seq 1 600); do
  grep -Eq "$ready" "$log" && break
  sleep 0.1
done
if ! grep -Eq "$ready" "$log"; then
  kill "$launcher" 2>/dev/null
  echo "nothing matched '$ready' within 60 s"; cat "$log"; exit 1
fi
sleep 1
kill "-$signal" "$victim"
trap 'kill -KILL "$victim" 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$launcher" 2>/dev/null; then
  kill -KILL "$launcher"
  kill -KILL "$victim" 2>/dev/null
  echo "the other ranks were still running 60 s after rank 1 got SIG$signal"; cat "$log"; exit 1
fi
wait "$launcher"
status=$?
if (( status == 0 )); then
  echo "mpirun exited 0 after rank 1 got SIG$signal"; cat "$log"; exit 1
fi
if ! grep -Eq "$pattern" "$log"; then
  echo "nothing matches '$pattern':"; cat "$log"; exit 1
fi
echo "rank 1 got SIG$signal: every rank ended (mpirun exit status $status)"
grep -E "$pattern" "$log"
