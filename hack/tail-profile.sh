#!/usr/bin/env bash
# Summarizes the per-operation perf profiles BenchmarkTail records with
# BENCH_TAIL_PERF=DIR (docs/benchmarks.md#tails): for each operation, the
# CPU its samples stand for, per process (ms of CPU per operation, given
# the ops timed and perf's sampling frequency), then the functions of the
# project and its libraries that most of it went through (inclusive), and
# the kernel's own hottest functions.
#   hack/tail-profile.sh DIR OPS [OP...]
# OPS is BENCH_TAIL_OPS of the run times BENCH_COUNT (the operations each
# profile holds); the OPs default to every DIR/*.data.
set -eu # not pipefail: head ends perf report early on purpose
dir=$1 ops=$2
shift 2
freq=4999 # BenchmarkTail's perf record -F
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
	for f in "$dir"/*.data; do names+=("$(basename "$f" .data)"); done
fi
for op in "${names[@]}"; do
	data=$dir/$op.data
	echo "== $op"
	# By process (a thread made after perf attached shows as ":TID" in
	# its comm, so samples are counted by thread group); processes with
	# no name of their own are the shim's helpers and inits.
	perf script -i "$data" -F pid,comm 2>/dev/null |
		awk -v ops="$ops" -v freq="$freq" '{n[$2]++; t++; if ($1 !~ /^:/) name[$2]=$1}
			END {for (p in n) {c=name[p]; if (c == "") c="(short-lived)"; s[c]+=n[p]}
				for (c in s) printf "  %-18s %6.2f ms CPU/op\n", c, s[c]/freq/ops*1000
				printf "  %-18s %6.2f ms CPU/op\n", "total", t/freq/ops*1000}' |
		sort -k2 -nr
	echo "  -- inclusive, project and libraries (% of the op's samples)"
	perf report -i "$data" --children --sort sym --stdio -g none 2>/dev/null |
		grep -E '^ +[0-9.]+%' | grep -v '\[k\]' |
		grep -E 'branchbox|containerd/(v2/core|ttrpc|continuity)|opencontainers|gob|json|mountinfo' |
		grep -vE 'ttrpc\.\(\*serviceSet\)|ttrpc\.defaultServerInterceptor|Register[A-Za-z]*Service\.func' |
		head -"${TOP:-14}" | awk '{$2=""; print "  " $0}'
	echo "  -- kernel, self"
	perf report -i "$data" --no-children --sort sym --stdio -g none 2>/dev/null |
		grep -E '^ +[0-9.]+%.*\[k\]' | head -"${KTOP:-6}" | awk '{print "  " $0}'
done
