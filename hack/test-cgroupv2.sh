#!/usr/bin/env bash
# Runs tests on a cgroup-v2-only kernel in a VM (hack/cgroupv2-vm.sh) in a
# temporary directory that is removed afterwards, and prints the log of
# each test that failed. Arguments: the VM runner's test specs (none: the
# whole suite). On a host that is itself cgroup v2 only, with
# CGV2_NATIVE_SKIP=1, it does nothing: the native run covered v2.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${CGV2_NATIVE_SKIP:-}" = 1 ] && [ -f /sys/fs/cgroup/cgroup.controllers ] &&
	! grep -q '^cgroup ' /proc/mounts; then
	echo "cgroup v2 only on this host: the native run covered v2"
	exit 0
fi
work=$(mktemp -d /tmp/bbx-cgv2.XXXXXX)
trap 'rm -rf "$work"' EXIT

# console prints the guest's console from its first kernel fault, if it
# has one, else its end.
console() {
	local first
	first=$(grep -n -m1 -E 'BUG:|Oops|general protection|invalid opcode|Kernel panic|WARNING:' "$work/out/console.log" 2>/dev/null | cut -d: -f1)
	if [ -n "$first" ]; then
		echo "=== the VM did not finish: its console from the first fault ==="
		tail -n +"$((first > 10 ? first - 10 : 1))" "$work/out/console.log" | head -n 200
	else
		echo "=== the VM did not finish: end of its console ==="
		tail -n 60 "$work/out/console.log" 2>/dev/null || true
	fi
}

rc=0
WORK=$work bash hack/cgroupv2-vm.sh "$@" || rc=$?
# The guest kernel under qemu's emulation (TCG) has panicked a few times in
# memory-fork tests, with a corrupt RIP or EFLAGS in kernel code (once in
# CI): an emulator's fault, not a test's. If every test it finished passed,
# those it did not run once more in a new VM, the panic shown first.
if [ "$rc" != 0 ] && [ $# -gt 0 ] && ! grep -q '^done$' "$work/out/summary.txt" 2>/dev/null &&
	! grep -q ' rc=[1-9]' "$work/out/summary.txt" 2>/dev/null &&
	grep -q 'Kernel panic' "$work/out/console.log" 2>/dev/null; then
	console
	left=()
	for spec in "$@"; do
		grep -q "^${spec%%:*} ${spec#*:} rc=0 " "$work/out/summary.txt" 2>/dev/null || left+=("$spec")
	done
	echo "=== the guest kernel panicked: once more, in a new VM: ${left[*]} ==="
	rc=0
	WORK=$work bash hack/cgroupv2-vm.sh "${left[@]}" || rc=$?
fi
if [ "$rc" != 0 ]; then
	# What failed, told in full: the VM's directory goes with this run.
	for f in "$work"/out/tests/*.log; do
		[ -f "$f" ] || continue
		t=$(basename "$f" .log)
		if grep -q "^${t%%.*} ${t#*.} rc=[1-9]" "$work/out/summary.txt" 2>/dev/null; then
			echo "=== $t (failed) ==="
			grep -v '^ *time=' "$f" | tail -n 150
		fi
	done
	if ! grep -q '^done$' "$work/out/summary.txt" 2>/dev/null; then
		console
	fi
fi
exit "$rc"
