//go:build linux

package shim

import (
	"fmt"
	"path/filepath"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/cgroups/systemd"
)

// checkRuncOptions decides, for each of runc's options a container is
// created with (what containerd's CRI passes from a handler's options
// table, or a Go client's runtime options), whether this runtime honours it or
// refuses the container, so that none is silently ignored (docs/cri.md):
//
//   - BinaryName: refused unless it names this runtime itself; the shim runs
//     containers with its own runtime and cannot run another OCI runtime.
//   - Root: honoured (the runtime's state directory, for the container and
//     its branches).
//   - SystemdCgroup: honoured (the runtime's --systemd-cgroup, recorded per
//     sandbox for its branches); refused when systemd is not the host's init,
//     with the fix, rather than failing later in the runtime.
//   - NoPivotRoot, NoNewKeyring: honoured (the runtime's --no-pivot and
//     --no-new-keyring, for the container and the branches it forks).
//   - ShimCgroup, IoUid, IoGid: honoured by runc-v2's shim manager and task
//     service, which this shim embeds.
//   - CriuImagePath, CriuWorkPath: refused; this runtime has no checkpoint
//     with CRIU.
//   - TaskApiAddress, TaskApiVersion: containerd's own (where it reaches a
//     sandbox's task API); they never concern the shim.
func checkRuncOptions(self string, o *options.Options) error {
	if o.BinaryName != "" && o.BinaryName != self && !isOwnRuntime(self, o.BinaryName) {
		return fmt.Errorf("runtime option BinaryName = %q: the branch runtime runs containers itself and cannot use another OCI runtime; remove BinaryName from the runtime's options: %w", o.BinaryName, errdefs.ErrInvalidArgument)
	}
	if o.CriuImagePath != "" || o.CriuWorkPath != "" {
		return fmt.Errorf("runtime options CriuImagePath/CriuWorkPath: the branch runtime does not checkpoint with CRIU; remove them from the runtime's options: %w", errdefs.ErrNotImplemented)
	}
	if o.SystemdCgroup && !systemd.IsRunningSystemd() {
		return fmt.Errorf("runtime option SystemdCgroup = true, but systemd is not this host's init, so it cannot manage the container's cgroups; set SystemdCgroup = false (and kubelet's cgroupDriver to cgroupfs): %w", errdefs.ErrFailedPrecondition)
	}
	return nil
}

// isOwnRuntime says whether binary is this shim's runtime installed beside
// it (containerd-shim-branch-v1-runtime), which runs containers the same.
func isOwnRuntime(self, binary string) bool {
	return filepath.Clean(binary) == self+"-runtime"
}
