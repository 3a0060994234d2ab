#!/usr/bin/env bash
# Compares the benchmarks of two revisions in the same run, for a change
# that must not move them (a restructuring): each revision is checked out
# in a temporary worktree with a copy of bin/ (the pinned daemons, CRIU,
# Kubernetes are the same), its own binaries and test binaries built, and
# the benchmarks run BENCH_COUNT times (default 5), alternating old and new,
# so that a noisy machine's drift falls on both. Prints benchstat old new.
#
# Usage: hack/bench-compare.sh OLD NEW
#   OLD, NEW: git revisions. BENCH_FILTER (a -bench regexp, default the
#   fork, commit, abort, checkpoint and rollback paths), BENCH_PKGS
#   (default snapshotter integration), BENCH_TIME (default 1s) as for
#   hack/bench.sh; the raw results go to BENCH_OUT (default
#   bin/bench-compare) as old.txt and new.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 OLD NEW" >&2; exit 2; }
repo=$PWD
# benchstat prints the comparison at the end: built first (make bench
# builds it too), not found after the rounds.
[ -n "${BENCHSTAT:-}" ] || make -s benchstat >/dev/null
filter=${BENCH_FILTER:-'^Benchmark(Fork|ForkEight|Commit|Abort|Checkpoint|Rollback|ContextFork|ContextCommit|ContextAbort|ContextExec)$'}
read -r -a pkgs <<<"${BENCH_PKGS:-snapshotter integration}"
out=${BENCH_OUT:-$repo/bin/bench-compare}
mkdir -p "$out"
tmp=$(mktemp -d)
running=""
cleanup() {
	# An interrupted run: its test binary and the daemons it started (one
	# process group) go; the mounts of a benchmark cut short may stay
	# (hack/leakcheck.sh lists them).
	[ -n "$running" ] && kill -- -"$running" 2>/dev/null || true
	for side in old new; do
		[ -d "$tmp/$side" ] && git -C "$repo" worktree remove --force "$tmp/$side" 2>/dev/null || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT
# Resolved now: HEAD may move while the old side builds.
declare -A rev=([old]="$(git -C "$repo" rev-parse --verify "$1^{commit}")" [new]="$(git -C "$repo" rev-parse --verify "$2^{commit}")")
for side in old new; do
	git -C "$repo" worktree add -q --detach "$tmp/$side" "${rev[$side]}"
	cp -a "$repo/bin" "$tmp/$side/bin"
	make -C "$tmp/$side" -s binaries >"$tmp/$side.build.log" 2>&1 || { tail -20 "$tmp/$side.build.log" >&2; exit 1; }
	for p in "${pkgs[@]}"; do
		(cd "$tmp/$side" && go test -c -o "$tmp/$side-${p//\//-}.test" "./$p/")
	done
	: >"$out/$side.txt"
	echo "$side: $(git -C "$repo" rev-parse --short "${rev[$side]}") built" >&2
done
for i in $(seq "${BENCH_COUNT:-5}"); do
	for side in old new; do
		for p in "${pkgs[@]}"; do
			(cd "$tmp/$side/$p" && BRANCHBOX_BIN="$tmp/$side/bin" exec setsid "$tmp/$side-${p//\//-}.test" -test.run '^$' \
				-test.bench "$filter" -test.benchtime "${BENCH_TIME:-1s}" -test.timeout 30m) >"$tmp/run" 2>&1 &
			running=$!
			if ! wait "$running"; then
				grep -v '^ *time=' "$tmp/run" | tail -40 >&2
				exit 1
			fi
			running=""
			cat "$tmp/run" >>"$out/$side.txt"
		done
	done
	echo "round $i/${BENCH_COUNT:-5} done" >&2
done
"${BENCHSTAT:-$repo/bin/benchstat}" "$out/old.txt" "$out/new.txt"
