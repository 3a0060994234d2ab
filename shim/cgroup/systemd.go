//go:build linux

package cgroup

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/cgroups/systemd"
)

// The shim works on cgroups as directories of the cgroup filesystem under
// either cgroup driver. With the cgroupfs driver the sandbox's
// linux.cgroupsPath is that directory. With the systemd driver it is
// "slice:prefix:name", which the runtime (libcontainer's systemd manager,
// as runc does) makes the transient unit prefix-name.scope in slice, with
// Delegate=yes: the scope's subtree is then its owner's to manage through
// the cgroup filesystem, and systemd leaves it alone. Branch cgroups (and
// the warm inits', the v2 .leaf and .sealed) are made there, below the
// scope's directory, exactly as below a cgroupfs sandbox's: nested, so a
// pause of the sandbox freezes its branches, its limits bound theirs, and
// the scope's stop kills and removes them with it. Units of their own
// could not nest (a scope has no child units), so they are not used.

// IsSystemdPath says whether a spec's cgroupsPath is in the systemd
// driver's "slice:prefix:name" form.
func IsSystemdPath(p string) bool {
	return strings.Count(p, ":") == 2 && !strings.HasPrefix(p, "/")
}

// SandboxPath resolves a sandbox's linux.cgroupsPath to its directory in
// the cgroup filesystem (relative to each hierarchy's mount point), under
// either driver, or says why branch cgroups cannot nest under it.
func SandboxPath(p string) (string, error) {
	if IsSystemdPath(p) {
		return systemdScopePath(p)
	}
	if p == "" || strings.Contains(p, ":") || !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("sandbox cgroup path %q is neither a cgroupfs path (\"/a/b\") nor a systemd one (\"slice:prefix:name\"); branches nest their cgroups under the sandbox's and need one of them: %w", p, errdefs.ErrNotImplemented)
	}
	return p, nil
}

// systemdScopePath is where libcontainer's systemd manager puts the
// cgroup of "slice:prefix:name": the scope prefix-name.scope in slice
// (system.slice if empty), expanded as systemd names slices
// ("a-b.slice" is /a.slice/a-b.slice).
func systemdScopePath(p string) (string, error) {
	parts := strings.Split(p, ":")
	slice, prefix, name := parts[0], parts[1], parts[2]
	if strings.HasSuffix(name, ".slice") {
		// The runtime would make a slice, which systemd does not delegate:
		// a cgroup made below it would be systemd's to remove.
		return "", fmt.Errorf("sandbox cgroup %q names a slice, not a scope: branch cgroups need the sandbox in a delegated scope (\"slice:prefix:name\" with a name not ending in .slice): %w", p, errdefs.ErrNotImplemented)
	}
	if name == "" {
		return "", fmt.Errorf("sandbox cgroup %q has no unit name: %w", p, errdefs.ErrInvalidArgument)
	}
	if slice == "" {
		slice = "system.slice"
	}
	dir, err := systemd.ExpandSlice(slice)
	if err != nil {
		return "", fmt.Errorf("sandbox cgroup %q: %v: %w", p, err, errdefs.ErrInvalidArgument)
	}
	unit := prefix + "-" + name + ".scope"
	if strings.Contains(unit, "/") {
		return "", fmt.Errorf("sandbox cgroup %q: unit name %q has a slash: %w", p, unit, errdefs.ErrInvalidArgument)
	}
	return path.Join(dir, unit), nil
}

// KeyDriverOnSpec makes the runtime use the systemd cgroup driver for a
// sandbox whose spec names a systemd unit ("slice:prefix:name", as
// nerdctl --cgroup-manager systemd and ctr --cgroup write it) even when
// the runtime options do not say SystemdCgroup: the options reach this
// shim only for some callers (containerd's CRI passes them to runc-type
// handlers only), the spec always does, and the cgroupfs driver would
// take that path for a directory name.
func KeyDriverOnSpec(ctx context.Context, id, cgroupsPath string, opts *options.Options) {
	if IsSystemdPath(cgroupsPath) && !opts.SystemdCgroup {
		log.G(ctx).WithField("id", id).WithField("cgroup", cgroupsPath).Debug("systemd cgroup path: using the systemd cgroup driver")
		opts.SystemdCgroup = true
	}
}
