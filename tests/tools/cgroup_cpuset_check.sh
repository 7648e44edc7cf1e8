#!/usr/bin/env bash
# cgroup_cpuset_check.sh NUMESH: runs `numesh run` inside a new cpuset cgroup limited to one CPU
# (as a Slurm job step or a container's cgroup limits a process, which taskset does not show:
# the CPUs are taken away by the cgroup, not by the process' own affinity), and checks that it
# gets a one-device mesh of one thread that runs to a passing check, within 120 s. The cgroup is
# removed afterwards. Exit 77 (reported as a skip) when no cpuset cgroup can be made here: it
# needs root and a writable cgroup v1 cpuset hierarchy or cgroup v2 with the cpuset controller.
set -u
numesh="$1"
skip() { echo "cgroup_cpuset_check: skipped: $*"; exit 77; }

v1=/sys/fs/cgroup/cpuset v2=/sys/fs/cgroup
if [[ -f "$v1/cpuset.cpus" ]]; then
  parent="$v1" tasks=tasks
  mems="$(cat "$v1/cpuset.mems")"
elif [[ -f "$v2/cgroup.controllers" ]] && grep -qw cpuset "$v2/cgroup.controllers"; then
  parent="$v2" tasks=cgroup.procs mems=""
  grep -qw cpuset "$v2/cgroup.subtree_control" || echo +cpuset >"$v2/cgroup.subtree_control" 2>/dev/null ||
    skip "cannot enable the cpuset controller in $v2"
else
  skip "no cpuset cgroup hierarchy under /sys/fs/cgroup"
fi
dir="$parent/numesh-cpuset-check-$$"
mkdir "$dir" 2>/dev/null || skip "cannot create $dir (not root, or a read-only cgroup filesystem)"
trap 'rmdir "$dir" 2>/dev/null' EXIT
# The last CPU this process may use: not CPU 0, where taskset's check pins.
cpu="$(taskset -pc $$ 2>/dev/null | sed 's/.*: //; s/.*[,-]//')"
cpu="${cpu:-0}"
echo "$cpu" >"$dir/cpuset.cpus" 2>/dev/null || skip "cannot limit $dir to CPU $cpu"
[[ -z "$mems" ]] || echo "$mems" >"$dir/cpuset.mems" || skip "cannot give $dir the memory nodes $mems"

out="$( (echo "$BASHPID" >"$dir/$tasks" &&
         exec timeout 120 "$numesh" run --policy core --hidden 32 --heads 4 --kv-heads 2 --head-dim 8 --ffn 64 \
              --moe-ffn 16 --experts 4 --prompt 8 --steps 2 --batch 2 --repeats 1 --quiet) 2>&1)"
rc=$?
echo "$out"
[[ $rc -eq 0 ]] || { echo "cgroup_cpuset_check: numesh run in a cgroup of CPU $cpu exited with $rc"; exit 1; }
grep -q "numesh run: 1 device (core policy, 1 thread)" <<<"$out" ||
  { echo "cgroup_cpuset_check: expected a one-device mesh of one thread in a cgroup of CPU $cpu"; exit 1; }
grep -Eq "check .*: ok" <<<"$out" || { echo "cgroup_cpuset_check: the run's check did not pass"; exit 1; }
echo "cgroup_cpuset_check: one device of one thread on CPU $cpu, check ok"
