#!/usr/bin/env bash
# Installs the Debian packages the tests and the demo need, if missing:
# busybox-static (the test image is built from it) and runc (the baseline
# runtime containerd-shim-runc-v2 drives) and libseccomp-dev (seccomp in
# containerd-shim-branch-v1, built with cgo) and systemd (systemd-analyze
# checks the installed units) and iproute2 (the CRI tests' CNI plugin) and
# gcc with libc6-dev (cgo, and the static branch init links libc.a) and
# e2fsprogs with mount (the out-of-space commit tests make a small ext4 on
# a loop device: mkfs.ext4, losetup) and xfsprogs with btrfs-progs (the
# snapshotter's tests on XFS and btrfs, hack/test-on-fs.sh) and python3.11 (the memory fork tests
# run Debian's Python REPL in a sandbox). The SDK and MCP tests run Debian's
# python3 and node with npm (installed only when the commands are missing:
# a node from elsewhere, with its own npm, is kept).
set -euo pipefail
pkgs=(busybox-static runc libseccomp-dev systemd iproute2 gcc libc6-dev e2fsprogs xfsprogs btrfs-progs mount python3.11)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ -x /usr/bin/python3 ] || missing+=(python3)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing ${missing[*]}"
exec "$(dirname "$0")/apt-install.sh" "${missing[@]}"
