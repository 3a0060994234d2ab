#!/usr/bin/env bash
# Runs branchbox's tests on a cgroup-v2-only Linux: a Debian 6.18 kernel
# (trixie-backports) booted under QEMU with cgroup_no_v1=all, the host's /
# shared read-only over 9p as the guest's root (so the guest has the host's
# runc, busybox, iproute2, systemd, dbus ... and this repo's bin/), state on
# guest tmpfs. PID 1 is systemd with its system D-Bus (what the systemd
# cgroup driver needs), booted into bbx-tests.target, whose one service
# runs the tests; its units that need a writable / fail, harmlessly.
# No network in the guest. Needs root, apt (the host's Debian mirror), ~1 GB disk.
# The guest runs the repo's bin/ over 9p: rebuilding it on the host while the
# VM runs hands the guest torn binaries (tests fail at random).
#
#   hack/cgroupv2-vm.sh [TEST_SPEC ...]   (run from the project's root; default: every integration test,
#                                            one by one, then the unit packages)
# TEST_SPEC: <pkg>:<TestName> or <pkg>:ALL, pkg = package path with / -> _,
#   e.g. integration:TestContextsKillSuite shim:ALL
# Env: GUEST_INIT (systemd, default; shell: a shell as PID 1, no systemd),
#   REPO (default: git toplevel), WORK (default /tmp/bbx-cgv2), MEM (8G),
#   SMP (2), ACCEL (auto: kvm if /dev/kvm runs a stock kernel, else tcg),
#   PER_TEST_TIMEOUT (s, default 600), GO_TIMEOUT (go test -timeout, 9m),
#   VM_TIMEOUT (s, the whole VM, 7200), VM_CPU (qemu's -cpu under TCG, max),
#   KERNEL_PKG (trixie-backports package,
#   default linux-image-6.18.15+deb13-amd64: >= 6.13 is needed for the
#   snapshotter's *xattrat syscalls), BRANCHBOX_TEST_KUBERNETES (passed to
#   the tests: full runs make test-kubernetes's long tests too).
set -euo pipefail
REPO=${REPO:-$(git rev-parse --show-toplevel)}
WORK=${WORK:-/tmp/bbx-cgv2}
MEM=${MEM:-8G}; SMP=${SMP:-2}
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/cache/archives/partial" "$WORK/out"
# 1. host packages: qemu, and the kernel + kmod debs unpacked under $WORK (not installed)
GUEST_INIT=${GUEST_INIT:-systemd}
#    (and what unpacks the kernel: zstd or xz, whichever Debian compressed it
#    with; and the systemd and dbus-daemon the guest runs, from the host's /)
want=(qemu-system-x86_64:qemu-system-x86 zstd:zstd xz:xz-utils busybox:busybox-static)
[ "$GUEST_INIT" != systemd ] || want+=(systemctl:systemd dbus-daemon:dbus)
need=(); for c in "${want[@]}"; do
  command -v ${c%%:*} >/dev/null || need+=(${c#*:})
done
[ ${#need[@]} = 0 ] || "$(dirname "$0")/apt-install.sh" "${need[@]}"
APTO=(-o "Dir::Etc::SourceList=$WORK/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$WORK/apt/lists" -o "Dir::Cache=$WORK/apt/cache" -o APT::Get::List-Cleanup=0)
if [ ! -f "$WORK/kernel/vmlinux" ]; then
  # the same Debian mirror the host's apt uses, trixie-backports suite
  uri=$(grep -hoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null | head -1 | tr -d ' ' || true)
  echo "deb ${uri%/} trixie-backports main" > "$WORK/apt/sources.list"
  apt-get "${APTO[@]}" update -qq
  # the tested kernel; newer ones may be split (a small linux-image-X
  # depending on linux-image-X-unsigned): KERNEL_PKG=...-unsigned then
  pkg=${KERNEL_PKG:-linux-image-6.18.15+deb13-amd64}
  # the kernel from trixie-backports; kmod (depmod/modprobe for the guest,
  # run from the host's /) from the host's own suite, so that it runs here
  (cd "$WORK/apt/cache" && apt-get "${APTO[@]}" download "$pkg" && { apt-get download kmod || { apt-get update -qq && apt-get download kmod; }; })
  rm -rf "$WORK/kernel" "$WORK/kmod"; mkdir -p "$WORK/kernel" "$WORK/kmod/wrap"
  dpkg-deb -x "$WORK/apt/cache/${pkg}"_*.deb "$WORK/kernel"
  dpkg-deb -x "$WORK"/apt/cache/kmod_*.deb "$WORK/kmod"
  ln -s usr/lib "$WORK/kernel/lib"
  for n in depmod modprobe; do ln -sf "$WORK/kmod/bin/kmod" "$WORK/kmod/wrap/$n"; done
  KV=$(ls "$WORK/kernel/usr/lib/modules" | head -1)
  "$WORK/kmod/wrap/depmod" -b "$WORK/kernel" "$KV"
  # PVH boot of the uncompressed kernel (QEMU -kernel takes the ELF)
  python3 - "$WORK/kernel/boot/vmlinuz-$KV" "$WORK/kernel/vmlinux" <<'PY'
import subprocess, sys
d = open(sys.argv[1], 'rb').read()
for magic, cmd in ((b'\x28\xb5\x2f\xfd', ['zstd', '-dc']), (b'\xfd7zXZ\x00', ['xz', '-dc'])):
    i = d.find(magic)
    while i >= 0:
        out = subprocess.run(cmd, input=d[i:], capture_output=True).stdout
        if out[:4] == b'\x7fELF':
            open(sys.argv[2], 'wb').write(out); sys.exit(0)
        i = d.find(magic, i + 1)
sys.exit("no vmlinux found in " + sys.argv[1])
PY
fi
KV=$(ls "$WORK/kernel/usr/lib/modules" | head -1)
# 2. binaries and test binaries, built on the host
make -C "$REPO" binaries
rm -rf "$WORK/tests"; mkdir -p "$WORK/tests"
# (only the packages named, when tests are named)
pkgs=$(for s in "$@"; do echo ${s%%:*}; done | sort -u)
for p in $(cd "$REPO" && go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./...); do
  rel=${p#github.com/branchbox/branchbox/}
  [ -z "$pkgs" ] || grep -qx "$(echo $rel | tr / _)" <<<"$pkgs" || continue
  (cd "$REPO" && go test -c -tags seccomp -o "$WORK/tests/$(echo $rel | tr / _).test" ./$rel)
done
# The build cache the guest's go uses (some tests build a static program
# for an image): the standard library compiled here, as those builds ask
# for it, since compiling it under emulation takes minutes.
mkdir -p "$WORK/gocache"
(cd "$REPO" && for f in "" -trimpath; do CGO_ENABLED=0 GOCACHE="$WORK/gocache" go build $f -o /dev/null ./integration/sysprobe; done)
# 3. initramfs: busybox + the 9p modules; /init mounts the host's /, the
#    guest's writable directories, the work directory and the repository,
#    and switch_roots. (systemd writes to /var/log and /var/cache too.)
TMPFS_DIRS="/var/tmp /var/lib"; [ "$GUEST_INIT" != systemd ] || TMPFS_DIRS="$TMPFS_DIRS /var/log /var/cache"
I=$(mktemp -d); trap 'rm -rf "$I"' EXIT
mkdir -p "$I/bin" "$I/proc" "$I/sys" "$I/dev" "$I/newroot" "$I/mod"
cp /bin/busybox "$I/bin/"
for m in netfs 9pnet 9pnet_virtio 9p; do xz -dc "$(find "$WORK/kernel/usr/lib/modules/$KV" -name "$m.ko.xz")" > "$I/mod/$m.ko"; done
cat > "$I/init" <<EOI
#!/bin/busybox sh
/bin/busybox mkdir -p /usr/bin /sbin /usr/sbin; /bin/busybox --install -s
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in netfs 9pnet 9pnet_virtio 9p; do insmod /mod/\$m.ko; done
o=trans=virtio,version=9p2000.L,msize=1048576
mount -t 9p -o \$o,ro,cache=loose hostroot /newroot || exec sh
# The guest's writable directories, tmpfs over the host's read-only ones,
# go first: the repository and the work directory are mounted after them,
# wherever they are (a clone under /var/tmp or /var/lib stays reachable).
mount -t tmpfs -o size=80% tmpfs /newroot/tmp
mount -t tmpfs -o mode=755 tmpfs /newroot/run
for d in $TMPFS_DIRS; do mount -t tmpfs tmpfs /newroot\$d; done
mkdir -p "/newroot$WORK" "/newroot$REPO"
mount -t 9p -o \$o,cache=mmap work "/newroot$WORK"
mount -t 9p -o \$o,ro,cache=loose repo "/newroot$REPO"
mount --move /dev /newroot/dev; mount --move /proc /newroot/proc; mount --move /sys /newroot/sys
exec switch_root /newroot /bin/bash "$WORK/guest-init.sh"
EOI
chmod +x "$I/init"
(cd "$I" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 > "$WORK/initramfs.cpio.gz")
# 4. the guest's PID 1: writable dirs, cgroup2 only (every controller on,
#    no process in the root cgroup, as under systemd), modules, the tests.
SPECS=${*:-}
if [ -z "$SPECS" ]; then
  SPECS=$(cd "$REPO" && grep -h '^func Test' integration/*_test.go | sed 's/func \(Test[A-Za-z0-9_]*\)(.*/\1/' | grep -vx TestMain | sed 's/^/integration:/' | tr '\n' ' ')
  for b in "$WORK"/tests/*.test; do b=$(basename "$b" .test); [ $b = integration ] || SPECS="$SPECS $b:ALL"; done
fi
# The host's go for the tests that build a program (an image's binary):
# its module cache read-only over 9p, nothing fetched (no network there).
GOBIN_DIR=$(dirname "$(command -v go)")
GOMODCACHE_DIR=$(go env GOMODCACHE)
# KVM only if it can run a stock kernel (nested PVM cannot: TCG then). The
# tests learn which (BRANCHBOX_TEST_EMULATED): under TCG some make their
# data smaller to fit their time.
ACCEL=${ACCEL:-auto}
if [ "$ACCEL" = auto ]; then ACCEL=tcg; [ -w /dev/kvm ] && ! [ -d /sys/module/kvm_pvm ] && ACCEL=kvm; fi
EMULATED=0; [ $ACCEL = tcg ] && EMULATED=1
# The tests, run by the guest's PID 1 (shell mode) or by a systemd unit.
cat > "$WORK/guest-tests.sh" <<EOG
#!/bin/bash
export PATH="$REPO/bin:$GOBIN_DIR:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" HOME=/tmp/home TMPDIR=/tmp BRANCHBOX_BIN="$REPO/bin" BRANCHBOX_TEST_EMULATED=$EMULATED BRANCHBOX_TEST_KUBERNETES="${BRANCHBOX_TEST_KUBERNETES:-}"
export GOMODCACHE="$GOMODCACHE_DIR" GOPROXY=off GOTOOLCHAIN=local GOFLAGS=-mod=readonly GOCACHE="$WORK/gocache"
# Under TCG the guest kernel can panic when CRIU sets a debug register
# (ptrace POKEUSER -> ptrace_set_breakpoint_addr -> perf_event_alloc: "Fatal
# exception in interrupt" in __schedule; TestMemoryRollback, 1 run in ~5).
# CRIU's own switch (fault 130, FI_NO_BREAKPOINTS, what it does on Xen) makes
# it stop a restored task by tracing syscalls instead; the shim's CRIU
# inherits it through containerd.
[ $EMULATED = 1 ] && export CRIU_FAULT=130
mkdir -p \$HOME
# Every controller on for the cgroups the tests make at the root and, under
# systemd, in system.slice (systemd enables only those its units use).
for d in /sys/fs/cgroup /sys/fs/cgroup/system.slice; do
  [ -d \$d ] || continue
  for c in \$(cat /sys/fs/cgroup/cgroup.controllers); do echo +\$c > \$d/cgroup.subtree_control || echo "cannot enable \$c in \$d"; done
done
ulimit -n 1048576
for m in overlay loop ext4 veth bridge br_netfilter nf_tables nft_chain_nat nft_compat unix_diag inet_diag tcp_diag udp_diag raw_diag netlink_diag af_packet_diag nf_conntrack_netlink tun; do "$WORK/kmod/wrap/modprobe" -d "$WORK/kernel" \$m || true; done
O="$WORK/out"; rm -rf "\$O/summary.txt" "\$O/tests" "\$O/journal.txt"; mkdir -p "\$O/tests"
for spec in $SPECS; do
  bin=\${spec%%:*}; t=\${spec#*:}; run=(); [ "\$t" = ALL ] || run=(-test.run "^\$t\\\$")
  s=\$(date +%s)
  (cd "$REPO/\$(echo \$bin | tr _ /)" && timeout -k 10 ${PER_TEST_TIMEOUT:-600} "$WORK/tests/\$bin.test" -test.v -test.count=1 -test.timeout ${GO_TIMEOUT:-9m} "\${run[@]}") > "\$O/tests/\$bin.\$t.log" 2>&1
  rc=\$?
  echo "\$bin \$t rc=\$rc \$((\$(date +%s)-s))s" | tee -a "\$O/summary.txt"
done
echo done >> "\$O/summary.txt"
[ -d /run/systemd/system ] && { systemctl list-units --all --no-pager > "\$O/units.txt" 2>&1; journalctl -b --no-pager > "\$O/journal.txt" 2>&1; }
sync; echo o > /proc/sysrq-trigger; sleep 10
EOG
# The guest's PID 1 after switch_root: writable dirs, then either systemd
# (GUEST_INIT=systemd, the default: PID 1 systemd with its system D-Bus, as
# libcontainer's systemd cgroup driver needs; it mounts cgroup2 itself and
# runs the tests in bbx-tests.service, whose cgroup is delegated) or this
# shell (GUEST_INIT=shell: cgroup2 mounted here, every controller on, no
# process in the root cgroup, the tests run by PID 1's child).
# systemd: the tests' target, no fstab (the host's is not the guest's)
SYSTEMD_ARGS=; [ $GUEST_INIT = systemd ] && SYSTEMD_ARGS="systemd.unit=bbx-tests.target fstab=no systemd.hostname=bbx-cgv2 systemd.show_status=error"
cat > "$WORK/guest-init.sh" <<EOG
#!/bin/bash
mkdir -p /dev/pts /dev/shm
# /run, /tmp, /var/tmp, /var/lib (and for systemd /var/log, /var/cache) are
# tmpfs already: the initramfs mounted them under the repository.
if [ $GUEST_INIT = systemd ]; then
  # The root is the host's, read-only: systemd's units that write to it
  # fail, which is tolerated; what they need to write goes to tmpfs.
  mkdir -p /run/systemd/system
  cat > /run/systemd/system/bbx-tests.target <<EOT
[Unit]
Description=branchbox tests
Wants=basic.target dbus.socket bbx-tests.service
After=basic.target
AllowIsolate=yes
EOT
  cat > /run/systemd/system/bbx-tests.service <<EOT
[Unit]
Description=branchbox tests, one at a time
Wants=dbus.socket
After=basic.target dbus.socket
[Service]
Type=oneshot
ExecStart=/bin/bash "$WORK/guest-tests.sh"
# The tests make cgroups below their own (containerd's, the shim's) and
# OOMs happen in them: the unit's cgroup is theirs, an OOM is not its end.
Delegate=yes
OOMPolicy=continue
TasksMax=infinity
LimitNOFILE=1048576
TimeoutStartSec=infinity
StandardOutput=journal+console
StandardError=journal+console
EOT
  # The host's / may have /.dockerenv, which makes systemd think it runs
  # in a container (and read its options from its own argv, not the
  # kernel's command line): an empty "container" variable says it does not; the
  # options are given on both, for whatever a generator decides.
  exec env container= /lib/systemd/systemd $SYSTEMD_ARGS
fi
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts; ln -sf pts/ptmx /dev/ptmx
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup
mkdir /sys/fs/cgroup/init.scope; echo \$\$ > /sys/fs/cgroup/init.scope/cgroup.procs
hostname bbx-cgv2; ip link set lo up
exec /bin/bash "$WORK/guest-tests.sh"
EOG
# 5. boot.
A=(-accel tcg,thread=multi,tb-size=512 -cpu "${VM_CPU:-max}"); [ $ACCEL = kvm ] && A=(-enable-kvm -cpu host)
rm -f "$WORK/out/summary.txt"
start=$(date +%s)
timeout -k 10 ${VM_TIMEOUT:-7200} qemu-system-x86_64 "${A[@]}" -smp $SMP -m $MEM -nographic -no-reboot \
  -kernel "$WORK/kernel/vmlinux" -initrd "$WORK/initramfs.cpio.gz" \
  -append "console=ttyS0 panic=-1 loglevel=4 cgroup_no_v1=all $SYSTEMD_ARGS" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap \
  -virtfs "local,path=${WORK//,/,,},mount_tag=work,security_model=passthrough,multidevs=remap" \
  -virtfs "local,path=${REPO//,/,,},mount_tag=repo,security_model=passthrough,readonly=on,multidevs=remap" \
  -nic none < /dev/null > "$WORK/out/console.log" 2>&1 || true
echo "VM ($ACCEL) ran $(( $(date +%s) - start ))s"
cat "$WORK/out/summary.txt"
grep -q '^done$' "$WORK/out/summary.txt" && ! grep -q ' rc=[1-9]' "$WORK/out/summary.txt"
