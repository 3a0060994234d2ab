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
			paths = append(paths, filepath.Join(bundle, branchesDir, e.Name(), "rootfs"), filepath.Join(bundle, branchesDir, e.Name(), restoreWorkDir))
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
	// A rollback with memory that was replacing the sandbox's processes
	// (rollbackroot.go) leaves their network namespace bound in the
	// bundle, and the restore's tmpfs copies mounted in its work
	// directory; the container's delete after this runs its hooks.
	dropKeptNetNS(ctx, bundle)
	if err := mount.UnmountRecursive(filepath.Join(bundle, sandboxRestoreWorkDir), unix.MNT_DETACH); err != nil {
		log.G(ctx).WithError(err).WithField("bundle", bundle).Warn("unmount what a restore left in the bundle")
	}
}

// stopBranches is the cleanup of a sandbox whose shim died: it force
// deletes every branch's runtime container (killing its processes
// through its cgroup) and detaches its rootfs mount. It needs nothing from
// the dead shim: the branches are found in the bundle.
func stopBranches(ctx context.Context, r *runcC.Runc, bundle, id string) {
	killBranchCgroups(ctx, bundle)
	// A branch the runtime was still creating or restoring when the shim
	// died has cgroups but no state the runtime's delete finds: the
	// branch cgroups, emptied above, are removed last.
	defer removeBranchCgroups(ctx, bundle)
	entries, _ := os.ReadDir(filepath.Join(bundle, branchesDir))
	for _, e := range entries {
		// Only a branch run by the runtime has its spec in its bundle;
		// one run by the branch init ends with the shim's control socket.
		if _, err := os.Stat(filepath.Join(bundle, branchesDir, e.Name(), "config.json")); err != nil {
			// fall through to the unmount
		} else if err := r.Delete(ctx, RuntimeID(id, e.Name()), &runcC.DeleteOpts{Force: true}); err != nil {
			log.G(ctx).WithError(err).WithField("branch", e.Name()).Warn("delete branch container")
		}
		if err := mount.UnmountRecursive(filepath.Join(bundle, branchesDir, e.Name(), "rootfs"), unix.MNT_DETACH); err != nil {
			log.G(ctx).WithError(err).WithField("branch", e.Name()).Warn("unmount branch rootfs")
		}
		detachNetns(ctx, filepath.Join(bundle, branchesDir, e.Name()))
	}
}

// killBranchCgroups kills every process in the cgroups below a sandbox's
// (branches, warm inits, the seal leaf), thawing them first. The runtime's
// force delete of the sandbox freezes, kills and thaws the sandbox's
// cgroup, but on cgroup v1 a child frozen by itself (a branch held for a
// commit when the shim died) stays frozen, and its processes with it,
// ignoring SIGKILL. A paused sandbox is killed whole and thawed first.
func killBranchCgroups(ctx context.Context, bundle string) {
	cg, ok := bundleCgroup(bundle)
	if !ok {
		return
	}
	killCgroupsBelow(ctx, cg)
}

// removeBranchCgroups removes the cgroups below a sandbox's (its branches',
// their seal and own leaves), deepest first; their processes are gone.
func removeBranchCgroups(ctx context.Context, bundle string) {
	cg, ok := bundleCgroup(bundle)
	if !ok {
		return
	}
	ms, err := cgroup.Mounts()
	if err != nil {
		return
	}
	// A killed task whose parent died too is reaped by the host's init,
	// maybe late, and on cgroup v1 keeps its cgroup busy until then:
	// tried for a while, within containerd's cleanup timeout.
	var err2 error
	for deadline := time.Now().Add(time.Second); ; time.Sleep(20 * time.Millisecond) {
		var errs []error
		for _, d := range cgroup.DirsIn(ms, cg) {
			entries, _ := os.ReadDir(d.Path)
			for _, e := range entries {
				// The sandbox's own leaves go with the sandbox's cgroup.
				if e.IsDir() && e.Name() != cgroup.OwnLeaf && e.Name() != cgroup.SealLeaf {
					errs = append(errs, cgroup.RemoveDirs(cgroup.DirsIn(ms, cg+"/"+e.Name())))
				}
			}
		}
		if err2 = errors.Join(errs...); err2 == nil || time.Now().After(deadline) {
			break
		}
	}
	if err2 != nil {
		log.G(ctx).WithError(err2).Warn("remove branch cgroups")
	}
}

// killCgroupsBelow is killBranchCgroups for the sandbox cgroup sbPath (a
// cgroupfs path: SandboxPath's).
func killCgroupsBelow(ctx context.Context, sbPath string) {
	ms, err := cgroup.Mounts()
	if err != nil {
		log.G(ctx).WithError(err).Warn("list cgroup hierarchies")
		return
	}
	sbDirs := cgroup.DirsIn(ms, sbPath)
	if len(sbDirs) > 0 && cgroup.Frozen(sbDirs) {
		// Paused: thawing a branch below the frozen sandbox does nothing.
		// Everything is killed while frozen (a frozen task takes a
		// pending SIGKILL as it thaws, before it runs again), then
		// thawed; the force delete that follows kills the sandbox anyway.
		if err := cgroup.SignalAll(ctx, sbDirs); err != nil {
			log.G(ctx).WithError(err).Warn("kill the processes of a paused sandbox at once")
		}
		cgroup.Thaw(sbDirs)
	}
	seen := map[string]bool{}
	for _, d := range sbDirs {
		entries, _ := os.ReadDir(d.Path)
		for _, e := range entries {
			if !e.IsDir() || seen[e.Name()] {
				continue
			}
			seen[e.Name()] = true
			path := sbPath + "/" + e.Name()
			if err := cgroup.KillDirs(ctx, path, cgroup.DirsIn(ms, path)); err != nil {
				log.G(ctx).WithError(err).WithField("cgroup", path).Warn("kill branch processes")
			}
		}
	}
}

// RemoveDeadSandboxCgroup is the last of the cleanup of a sandbox whose
// shim died, after the runtime's delete: a shim killed while a rollback
// with memory restored the sandbox's processes leaves, if the restore had
// not yet written the runtime's state, the sandbox's cgroup (and maybe
// restored processes in it) that the delete did not find. Those processes
// are killed and the cgroup removed; a cgroup the delete removed is not
// there any more.
func RemoveDeadSandboxCgroup(ctx context.Context, bundle string) {
	cg, ok := bundleCgroup(bundle)
	if !ok {
		return
	}
	ms, err := cgroup.Mounts()
	if err != nil {
		return
	}
	dirs := cgroup.DirsIn(ms, cg)
	var present []cgroup.Dir
	for _, d := range dirs {
		if _, err := os.Stat(d.Path); err == nil {
			present = append(present, d)
		}
	}
	if len(present) == 0 {
		return
	}
	log.G(ctx).WithField("cgroup", cg).Warn("removing the cgroup of a sandbox whose shim died while restoring its processes")
	if err := cgroup.KillDirs(ctx, cg, present); err != nil {
		log.G(ctx).WithError(err).Warn("kill what is left in a dead sandbox's cgroup")
	}
	// Reaped by the host's init, maybe late (see removeBranchCgroups).
	for deadline := time.Now().Add(time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err = cgroup.RemoveDirs(present); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		log.G(ctx).WithError(err).Warn("remove a dead sandbox's cgroup")
	}
}

// bundleCgroup is the cgroup path (SandboxPath's) of the sandbox whose
// bundle this is, if its spec names one.
func bundleCgroup(bundle string) (string, bool) {
	spec, err := ReadSpec(bundle)
	if err != nil || spec.Linux == nil {
		return "", false
	}
	cg, err := cgroup.SandboxPath(spec.Linux.CgroupsPath)
	return cg, err == nil
}
