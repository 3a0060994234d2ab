#!/usr/bin/env bash
# Runs a command (go test ...) with its temporary directories (t.TempDir,
# the test daemons' state and roots) on a new filesystem of type FS (xfs,
# btrfs) on a loop device, removed after. Nodes keep /var/lib/containerd on
# XFS (RHEL, Amazon Linux) or btrfs as often as on ext4, and their
# timestamps, block accounting and writeback differ from ext4's: the
# checkpoints' change detection and the usage the kubelet reads rest on
# them.
# usage: hack/test-on-fs.sh xfs|btrfs COMMAND...
set -euo pipefail
fs=$1
shift
case "$fs" in xfs | btrfs) ;; *) echo "usage: $0 xfs|btrfs COMMAND..." >&2; exit 2 ;; esac
# As short as /tmp: the tests' socket paths under it (a branch socket in a
# bundle: 98 bytes under /tmp) must stay below the kernel's 108.
mnt=$(mktemp -d /bxXXX)
img=$(mktemp /var/tmp/bbx-fs-XXXXXX.img)
cleanup() {
	umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
	rm -f "$img"
	rmdir "$mnt" 2>/dev/null || true
}
trap cleanup EXIT
truncate -s 3G "$img"
"mkfs.$fs" -q "$img" >/dev/null
mount -o loop "$img" "$mnt"
chmod 1777 "$mnt"
echo "on $fs at $mnt: $*"
TMPDIR=$mnt "$@"
