//go:build linux

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/branchbox/branchbox/shim/cgroup"
	cshim "github.com/containerd/containerd/v2/pkg/shim"

	"github.com/containerd/containerd/v2/core/mount"
	runcC "github.com/containerd/go-runc"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// A pod's containers are all served by the shim started for its sandbox.
// When that shim is killed, containerd runs the shim binary's `delete` only
// for the sandbox, and removes the other containers' bundles itself: their
// processes, cgroups and runtime state (and their branches) would stay.
// So each container gets a record, beside its runtime state, of the shim
// serving it; the `delete` of a dead shim's container ends every container
// whose record names the same shim (stopDeadGroup).

// memberFile is the record's name in a container's runtime state directory
// (<root>/<namespace>/<id>/, libcontainer's, removed with it).
const memberFile = "branchbox-shim.json"

// member is the record of a container served by a shim.
type member struct {
	// Address is the shim's socket, as containerd recorded it.
	Address string `json:"address"`
	// Bundle is the container's bundle directory.
	Bundle string `json:"bundle"`
	// CgroupsPath is the container's cgroup, which its branches' are below.
	CgroupsPath string `json:"cgroupsPath,omitempty"`
}

// RecordMember writes the record of container id, just created in bundle
// by the runtime with state under stateRoot (<root>/<namespace>).
func RecordMember(stateRoot, id, bundle string) error {
	address, err := ShimAddress(bundle)
	if err != nil {
		return fmt.Errorf("read the shim's address: %w", err)
	}
	m := member{Address: address, Bundle: bundle}
	if spec, err := ReadSpec(bundle); err == nil && spec.Linux != nil {
		m.CgroupsPath = spec.Linux.CgroupsPath
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	dir := filepath.Join(stateRoot, id)
	tmp := filepath.Join(dir, memberFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write the record of container %s: %w", id, err)
	}
	return os.Rename(tmp, filepath.Join(dir, memberFile))
}

// shimServed says whether something answers on a shim's socket address.
// Only a refused or missing socket is a dead shim: on any other error the
// shim is taken as alive, and its containers are left alone.
func shimServed(address string) bool {
	path, ok := strings.CutPrefix(address, "unix://")
	if !ok {
		return true // abstract or another scheme: not ours to judge
	}
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		conn.Close()
		return true
	}
	return !errors.Is(err, unix.ECONNREFUSED) && !errors.Is(err, os.ErrNotExist)
}

// stopDeadGroup ends every container other than id whose record names the
// dead shim at address, with its branches: processes killed (frozen
// cgroups thawed), cgroups and runtime state removed, root filesystems
// unmounted. stateRoot is <root>/<namespace>.
func stopDeadGroup(ctx context.Context, r *runcC.Runc, stateRoot, id, address string) {
	entries, err := os.ReadDir(stateRoot)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.G(ctx).WithError(err).Warn("list the containers of a dead shim")
		}
		return
	}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == id {
			continue
		}
		b, err := os.ReadFile(filepath.Join(stateRoot, e.Name(), memberFile))
		if err != nil {
			continue // not created through a shim (a branch), or not ours
		}
		var m member
		if err := json.Unmarshal(b, &m); err != nil || m.Address != address {
			continue
		}
		stopMember(ctx, r, stateRoot, e.Name(), m)
	}
}

// stopMember ends container cid of a dead shim, as Stop ends the one it is
// run for, from its record: its bundle may be half removed by containerd
// already (renamed to .<cid>, its spec gone).
func stopMember(ctx context.Context, r *runcC.Runc, stateRoot, cid string, m member) {
	l := log.G(ctx).WithField("container", cid)
	l.Info("ending a container of the dead shim")
	if cg, err := cgroup.SandboxPath(m.CgroupsPath); err == nil {
		killCgroupsBelow(ctx, cg)
	}
	// Branches run by the runtime have their own runtime state.
	if entries, err := os.ReadDir(stateRoot); err == nil {
		for _, e := range entries {
			if b, ok := strings.CutPrefix(e.Name(), RuntimeID(cid, "")); ok && b != "" {
				if err := r.Delete(ctx, e.Name(), &runcC.DeleteOpts{Force: true}); err != nil {
					l.WithError(err).WithField("branch", b).Warn("delete branch container")
				}
			}
		}
	}
	if err := r.Delete(ctx, cid, &runcC.DeleteOpts{Force: true}); err != nil {
		l.WithError(err).Warn("failed to remove container")
	}
	// Runtime state the runtime could not load (no state.json) is ours
	// to remove, record included.
	dir := filepath.Join(stateRoot, cid)
	if _, err := os.Stat(filepath.Join(dir, "state.json")); errors.Is(err, os.ErrNotExist) {
		if err := os.RemoveAll(dir); err != nil {
			l.WithError(err).Warn("remove runtime state")
		}
	}
	for _, bundle := range []string{m.Bundle, filepath.Join(filepath.Dir(m.Bundle), "."+filepath.Base(m.Bundle))} {
		if _, err := os.Stat(bundle); err != nil {
			continue
		}
		unmountBundle(ctx, bundle)
		if filepath.Base(bundle) != filepath.Base(m.Bundle) {
			// containerd renamed it to delete it and gave up at a mount.
			if err := os.RemoveAll(bundle); err != nil {
				l.WithError(err).Warn("remove the bundle containerd left")
			}
		}
	}
}

// unmountBundle unmounts a container's root filesystem and its branches'.
func unmountBundle(ctx context.Context, bundle string) {
	paths := []string{filepath.Join(bundle, "rootfs")}
	if entries, err := os.ReadDir(filepath.Join(bundle, branchesDir)); err == nil {
		for _, e := range entries {
			paths = append(paths, filepath.Join(bundle, branchesDir, e.Name(), "rootfs"))
		}
	}
	for _, p := range paths {
		if err := mount.UnmountRecursive(p, unix.MNT_DETACH); err != nil {
			log.G(ctx).WithError(err).WithField("path", p).Warn("unmount root filesystem of a dead shim's container")
		}
	}
	if entries, err := os.ReadDir(filepath.Join(bundle, branchesDir)); err == nil {
		for _, e := range entries {
			detachNetns(ctx, filepath.Join(bundle, branchesDir, e.Name()))
		}
	}
}

// ShimAddress is the shim's socket address as containerd recorded it in
// the bundle: bootstrap.json (containerd 2), or the older address file.
func ShimAddress(bundle string) (string, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "bootstrap.json"))
	if err == nil {
		var params cshim.BootstrapParams
		if err := json.Unmarshal(b, &params); err != nil {
			return "", fmt.Errorf("read %s/bootstrap.json: %w", bundle, err)
		}
		if params.Address == "" {
			return "", fmt.Errorf("no address in %s/bootstrap.json: %w", bundle, cshim.ErrNoAddress)
		}
		return params.Address, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	return cshim.ReadAddress(filepath.Join(bundle, "address"))
}

// StopDead ends what a dead shim left of sandbox id (bundle): the other
// containers it served (a pod's: containerd runs its cleanup only for the
// one it started the shim for), and the branches, CRIU runs and memory
// images of this one; the caller then deletes the sandbox's container.
func StopDead(ctx context.Context, r *runcC.Runc, stateRoot, bundle, id string) {
	if address, err := ShimAddress(bundle); err == nil && !shimServed(address) {
		stopDeadGroup(ctx, r, stateRoot, id, address)
	}
	killCriuOf(ctx, bundle)
	stopBranches(ctx, r, bundle, id)
	removeMemoryImages(ctx, bundle)
}
