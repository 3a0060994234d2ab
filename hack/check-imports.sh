#!/usr/bin/env bash
# The layering (docs/dev/architecture.md), checked on what `go list -deps`
# says each package links: fails naming the package and what it must not
# import.
set -euo pipefail
cd "$(dirname "$0")/.."
m=$(go list -m)
bad=0
# forbid PKGS PATTERN WHY: no package of PKGS may depend on one matching PATTERN.
forbid() {
	local pkgs=$1 pattern=$2 why=$3 p hits
	for p in $(go list -tags seccomp $pkgs); do
		hits=$(go list -tags seccomp -deps "$p" | grep -E "$pattern" || true)
		if [ -n "$hits" ]; then
			echo "$p must not import $(echo "$hits" | tr '\n' ' ')($why)"
			bad=1
		fi
	done
}
# The shim calls the snapshotter's branch API through its client,
# client/branchapi, and nothing else of client/.
forbid ./shim/... "^$m/(snapshotter|patterns|client/oci|httpapi|mcpserver|internal/ops)(/|$)|^$m/client$" "the shim and the snapshotter are peers; the clients are above both"
forbid ./snapshotter/... "^$m/(shim|client|patterns|httpapi|mcpserver|internal/ops)(/|$)" "the shim and the snapshotter are peers; the clients are above both"
# Inside the shim, from the top: shim (the task service and the wiring)
# over shim/sandbox (sandboxes, branches and their operations) over
# shim/initdriver (the branch init) over shim/cgroup (docs/design.md).
forbid ./shim/sandbox/... "^$m/shim$" "the sandboxes are below the task service that serves them"
forbid ./shim/initdriver/... "^$m/shim(/sandbox)?$" "the branch init's driver is below the sandboxes that use it"
forbid ./shim/cgroup/... "^$m/shim(/sandbox|/initdriver)?$" "the cgroup work is below the branch init and the sandboxes"
# The HTTP API and the MCP server are fronts on the clients (through
# internal/ops for what they share), and the clients know nothing of them.
forbid "./httpapi/... ./mcpserver/... ./internal/ops/..." "^$m/(shim|snapshotter|patterns|internal/daemons|integration|cmd)(/|$)" "the servers are fronts on the clients, below the commands"
forbid "./client/... ./patterns/..." "^$m/(httpapi|mcpserver|internal/ops)(/|$)" "the clients are below the servers built on them"
forbid ./branch/... "^$m/(shim|snapshotter|client|patterns|cmd|internal/daemons)(/|$)" "branch/ is the domain core, below everything"
forbid ./cmd/containerd-shim-branch-v1/... "^go.etcd.io/bbolt$|^$m/snapshotter" "the shim binary links neither bbolt nor the snapshotter"
forbid "./cmd/..." "^$m/(integration|internal/fstest)(/|$)" "the shipped binaries do not link tests"
# branchctl and the clients find a snapshot's root through branch/
# (RootOfUpper, the layout), never through the snapshotter.
forbid "./cmd/branchctl/... ./cmd/branchctl-full/... ./internal/branchctl/... ./client/..." "^$m/snapshotter(/|$)" "branchctl and the clients reach the snapshotter only through its API"
# branchctl links only what its everyday commands need: every package it
# links runs its initialisation on every start. The heavy commands (serve,
# mcp, push, pull, save, load) are in branchctl-full, which it execs
# (internal/branchctl/heavy.go); containerd's pkg/shim is the shim
# framework (client computes the shim's socket itself).
forbid "./cmd/branchctl ./internal/branchctl/..." "^$m/(client/oci|httpapi|mcpserver|internal/ops)(/|$)|^github.com/containerd/containerd/v2/(client|pkg/shim)$|^github.com/modelcontextprotocol/|^github.com/google/jsonschema-go/|^github.com/distribution/|^github.com/klauspost/compress/|^go.opentelemetry.io/|^github.com/google/go-cmp/|^encoding/gob$" "branchctl's start pays for every package it links; the heavy commands are branchctl-full's"
# The one /proc scanner sits below the shim and the snapshotter that use it.
forbid ./internal/procfd/... "^$m/(shim|snapshotter|client|branch|patterns|httpapi|mcpserver|internal/ops|cmd)(/|$)" "internal/procfd is below the shim and the snapshotter"
exit $bad
