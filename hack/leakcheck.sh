#!/usr/bin/env bash
# Fails if the tests left overlay mounts, the snapshotter's id-mapped views,
# runtime state of a finished env, or project daemons behind (containerd,
# shims, the snapshotter, the Kubernetes tests' etcd, kube-apiserver and
# kubelet). Daemons count when they run from this checkout's bin/ (other
# checkouts on the same machine may be testing at the same time); mounts
# are machine-wide.
set -u
bin=${BRANCHBOX_BIN:-$(cd "$(dirname "$0")/.." && pwd)/bin}
leaks=0
m=$(findmnt -rn -t overlay -o TARGET | grep -v '^/$' || true)
if [ -n "$m" ]; then echo "leaked overlay mounts:"; echo "$m"; leaks=1; fi
# The snapshotter's id-mapped views of image layers (docs/userns.md).
v=$(findmnt -rn -o TARGET | grep -E '/branches/[0-9]+/idmap$' || true)
if [ -n "$v" ]; then echo "leaked id-mapped views:"; echo "$v"; leaks=1; fi
# (the command line after the pid: bin may hold spaces)
p=$(ps -eo pid=,args= | awk -v bin="$bin/" '{ a = $0; sub(/^ *[0-9]+ /, "", a) } index(a, bin) == 1' | grep -E 'containerd-branch-snapshotter|containerd-shim-branch|/containerd --config|containerd-shim-runc|/kubelet |/kube-apiserver |/etcd ' || true)
if [ -n "$p" ]; then echo "leaked daemons:"; echo "$p"; leaks=1; fi
# The runtimes' state of a test env's namespace (bbx-<env dir>) whose env
# is gone: what a sandbox or branch left when its env was cleaned up. Envs
# are looked for in $TMPDIR: one made elsewhere (TestStatePathWithSpace's)
# and still running would count, so run this when no test runs.
for d in /run/containerd/branch/bbx-* /run/containerd/runc/bbx-*; do
	[ -d "$d" ] || continue
	ns=${d##*/}
	if [ ! -d "${TMPDIR:-/tmp}/${ns#bbx-}" ]; then echo "leaked runtime state: $d"; ls -A "$d"; leaks=1; fi
done
# The FIFOs of execs that ended (internal/fifoio: the Go client's, bx-ID,
# and the HTTP and MCP servers' execs of a sandbox's task, api-ID) that no
# process holds open any more: an exec not released.
held=$(find /proc/[0-9]*/fd -maxdepth 1 -lname '/run/containerd/fifo/*' -printf '%l\n' 2>/dev/null | xargs -r -n1 dirname | sort -u)
for d in /run/containerd/fifo/*/; do
	d=${d%/}
	[ -d "$d" ] || continue
	ls "$d" | grep -qE '^(bx|api)-' || continue
	if ! grep -qxF "$d" <<<"$held"; then echo "leaked exec FIFOs: $d"; ls -A "$d"; leaks=1; fi
done
exit $leaks
