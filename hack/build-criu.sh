#!/usr/bin/env bash
# Builds CRIU, which memory forks dump and restore sandboxes' processes
# with (docs/memory-fork.md), into bin/criu from a pinned release.
#
# Why built: Debian 12's criu 3.17 fails its vDSO check on the 6.x kernels
# these nodes run; Debian's 4.x binaries need a newer glibc. Why 4.2.1: 4.1.1
# cannot dump an inet socket on kernels from 6.16 on, which answer
# getsockopt(SO_PASSCRED) on one with EOPNOTSUPP ("sockets: Can't get 1:16
# opt"); 4.2 asks it of unix and netlink sockets only. Its source is the
# release's upstream tarball from Debian's archive (apt-get source, from
# forky or sid, which carry 4.2.1-1, through the mirror the host's apt
# already uses), checked against the sha256 below before anything is built.
#
# Patched (hack/criu/*.patch, applied in order): an external network
# namespace is dumped as its key only (0001), which a container's always is;
# a root task restored into a new user namespace is born in the external
# network namespace, which it could not join from there (0002); a dump
# collects the sockets of its network namespaces when it first meets one,
# not with the tasks stopped whether they hold any or not (0003); a quoted
# value of its configuration file may hold a space (0004: the runtime's
# restore names paths below the bundle there); a task's resource limits are
# read from /proc/PID/limits where prlimit() is refused it (0005: root
# without CAP_SYS_RESOURCE dumping a task of another uid).
#
# Usage: hack/build-criu.sh BIN_DIR
set -euo pipefail
CRIU_VERSION=4.2.1
CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
bin=${1:?usage: build-criu.sh BIN_DIR}
mkdir -p "$bin"
bin=$(cd "$bin" && pwd)

# The build's dependencies (Debian 12 has them all); iptables is what CRIU
# locks a dumped network namespace with.
pkgs=(libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev protobuf-compiler libnl-3-dev libnet1-dev
	libcap-dev pkg-config libbsd-dev uuid-dev python3 make gcc xz-utils iptables git)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing ${missing[*]}"
	"$(dirname "$0")/apt-install.sh" "${missing[@]}"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/src"
# the mirror the host's apt uses, the suites that carry the release
uri=$(grep -hoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
	/etc/apt/sources.list.d/*.list 2>/dev/null | head -1 | tr -d ' ' || true)
[ -n "$uri" ] || { echo "build-criu: no Debian mirror in /etc/apt/sources.list*" >&2; exit 1; }
printf 'deb-src %s forky main\ndeb-src %s sid main\n' "${uri%/}" "${uri%/}" > "$work/apt/sources.list"
apto=(-o Dir::Etc::SourceList="$work/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o Dir::State::Lists="$work/apt/lists" -o Dir::Cache="$work/apt/cache" -o APT::Get::List-Cleanup=0
	-o APT::Sandbox::User=root)
apt-get "${apto[@]}" update -qq
# Only the upstream tarball is needed (the Debian packaging is not used), and
# the mirror may not serve the rest: its own check is the sha256 below.
(cd "$work/src" && apt-get "${apto[@]}" source --download-only "criu=${CRIU_VERSION}-1" >/dev/null 2>&1 || true)
tarball="$work/src/criu_${CRIU_VERSION}.orig.tar.xz"
[ -f "$tarball" ] || { echo "build-criu: criu_${CRIU_VERSION}.orig.tar.xz could not be downloaded" >&2; exit 1; }
echo "$CRIU_SHA256  $tarball" | sha256sum -c --quiet - || { echo "build-criu: checksum mismatch" >&2; exit 1; }
tar -C "$work/src" -xf "$tarball"
# The project's patches to that release (hack/criu/*.patch, each saying why;
# git apply works outside a repository too).
for p in "$(cd "$(dirname "$0")" && pwd)"/criu/*.patch; do
	[ -e "$p" ] || continue
	(cd "$work/src/criu-${CRIU_VERSION}" && git apply -p1 "$p") || { echo "build-criu: $p does not apply" >&2; exit 1; }
done
# Without GnuTLS (the page server's TLS) and nftables (a network lock by
# nft), neither of which a memory fork uses, even where their headers are
# installed: CRIU starts two to three times a fork (the dump, libcontainer's
# version probe, each restore), and loading their 14 libraries took 1.7 of
# its 3 ms start here.
printf '#!/bin/sh\ncase "$*" in *libnftables*|*gnutls*) exit 1;; esac\nexec pkg-config "$@"\n' >"$work/pkg-config"
chmod +x "$work/pkg-config"
make -C "$work/src/criu-${CRIU_VERSION}" -j"$(nproc)" NO_GNUTLS=1 PKG_CONFIG="$work/pkg-config" criu >"$work/build.log" 2>&1 ||
	{ tail -30 "$work/build.log" >&2; exit 1; }
install -m 0755 "$work/src/criu-${CRIU_VERSION}/criu/criu" "$bin/criu"
"$bin/criu" --version
