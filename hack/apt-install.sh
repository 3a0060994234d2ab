#!/usr/bin/env bash
# Installs Debian packages (apt-get update, then install), waiting for the
# system's apt locks when another apt holds them (unattended upgrades, a
# second build on the machine) instead of failing at once: apt-get's
# DPkg::Lock::Timeout covers dpkg's lock but not update's lists lock.
set -euo pipefail
[ $# -gt 0 ] || exit 0
export DEBIAN_FRONTEND=noninteractive
apt_wait() {
	local out
	for _ in $(seq 120); do
		if out=$(apt-get -o DPkg::Lock::Timeout=5 "$@" 2>&1); then
			[ -z "$out" ] || printf '%s\n' "$out"
			return 0
		fi
		grep -q 'Could not get lock' <<<"$out" || { printf '%s\n' "$out" >&2; return 1; }
		sleep 5
	done
	printf '%s\n' "$out" >&2
	return 1
}
apt_wait update -qq
apt_wait install -y -qq --no-install-recommends "$@"
