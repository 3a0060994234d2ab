#!/usr/bin/env bash
# Runs every benchmark with its baselines in the same run and prints one
# table of medians and ratios. The test binaries are built once and run
# BENCH_COUNT times (default 10), alternating, so that drift on a noisy
# machine falls on branchbox and baselines alike. BENCH_TIME is the
# -benchtime of each run (default 1s: slow baselines such as cp -a of 100,000 files then run once a round).
# BENCH_FILTER (a -bench regexp, default all) and BENCH_PKGS (default the
# three packages below) run a part, e.g. BENCH_PKGS=integration
# BENCH_FILTER=BenchmarkContext for the branch contexts alone. The raw
# results are written to BENCH_OUT (default bin/bench.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
export BRANCHBOX_BIN=${BRANCHBOX_BIN:-$PWD/bin}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
read -r -a pkgs <<<"${BENCH_PKGS:-snapshotter snapshotter/apply integration}"
for p in "${pkgs[@]}"; do
	go test -c -o "$tmp/${p//\//-}.test" "./$p/"
done
for i in $(seq "${BENCH_COUNT:-10}"); do
	for p in "${pkgs[@]}"; do
		if ! (cd "$p" && "$tmp/${p//\//-}.test" -test.run '^$' -test.bench "${BENCH_FILTER:-.}" -test.benchtime "${BENCH_TIME:-1s}" -test.timeout 30m) >"$tmp/run" 2>&1; then
			# A failed benchmark says why (its log, without the daemons' debug lines).
			grep -v '^ *time=' "$tmp/run" | tail -40 >&2
			exit 1
		fi
		cat "$tmp/run" >>"$tmp/out"
	done
	echo "round $i/${BENCH_COUNT:-10} done" >&2
done
# The raw results stay for benchstat comparisons across runs
# (benchstat old.txt new.txt).
cp "$tmp/out" "${BENCH_OUT:-bin/bench.txt}"
echo
# Medians with their confidence intervals, one column per impl, branchbox
# first (benchstat's "vs base" is a significance-gated percent change).
impls=$(grep -oE '/impl=[A-Za-z0-9-]+' "$tmp/out" | sed -E 's#^/impl=##; s#-[0-9]+$##' | sort -u | grep -vx branch | tr '\n' ' ')
"${BENCHSTAT:-bin/benchstat}" -col "/impl@(branch $impls)" "$tmp/out"
echo
# benchstat cannot show a ratio per row against that row's own baseline
# (fork vs cp -a, commit vs overlayfs): benchtable prints those.
go run ./hack/benchtable < "$tmp/out"
