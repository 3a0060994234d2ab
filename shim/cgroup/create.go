//go:build linux

package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/log"
	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/shim/ocirt"
)

// OwnLeaf is the child cgroup, on cgroup v2, that a branch's own
// processes (not its branches') live in once it has branch cgroups: the
// kernel's no-internal-process rule lets a cgroup that holds processes
// give its children no domain controller (memory, io, and cpu on older
// kernels), and libcontainer then makes a branch's cgroup threaded, where
// memory limits, the OOM count, cgroup.kill and the process list are all
// missing. The runtime's exec into the branch goes into this leaf too.
const OwnLeaf = ocirt.OwnLeaf

// OwnDirs lists the cgroup directories that hold a branch's own
// processes on one hierarchy (its directory dir): dir itself, its v2 leaf
// and its seal leaf.
func OwnDirs(dir string) []string {
	return []string{dir, filepath.Join(dir, OwnLeaf), filepath.Join(dir, SealLeaf)}
}

// PrepareBranchParent makes the cgroup of a branch (path) ready to hold
// branch cgroups as domain cgroups, on cgroup v2: its processes move into
// its leaf (OwnLeaf) and the controllers it has are enabled for its
// children. It is done once per branch, before its first branch cgroup;
// on v1 (and a hybrid host, whose unified hierarchy has no controllers)
// there is nothing to do.
func PrepareBranchParent(ctx context.Context, path string) error {
	if !cgroups.IsCgroup2UnifiedMode() {
		return nil
	}
	dir := filepath.Join("/sys/fs/cgroup", path)
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("read controllers of cgroup %s: %w", path, err)
	}
	want := strings.Fields(string(b))
	if len(want) == 0 {
		return nil
	}
	leaf := filepath.Join(dir, OwnLeaf)
	if have, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control")); err == nil && IsDir(leaf) && len(strings.Fields(string(have))) == len(want) {
		return nil // done by an earlier fork
	}
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("make leaf cgroup of %s: %w", path, err)
	}
	enable := "+" + strings.Join(want, " +")
	// A process of the branch may fork while the others are moved: the
	// kernel then refuses the controllers (EBUSY), and the move repeats.
	for try := 0; ; try++ {
		if err := moveAll(dir, leaf); err != nil {
			return fmt.Errorf("move the processes of cgroup %s into its leaf: %w", path, err)
		}
		err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(enable), 0)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || try == 100 {
			// One by one: what cannot be enabled (a controller the
			// parent does not delegate) is left off, as libcontainer does.
			for _, c := range want {
				if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0); err != nil {
					log.G(ctx).WithError(err).WithField("cgroup", path).Warnf("enable controller %s for branch cgroups", c)
				}
			}
			return nil
		}
	}
}

// moveAll moves every process of the cgroup dir into the cgroup to, until
// none is left (a process can fork while the others are moved).
func moveAll(dir, to string) error {
	for i := 0; i < 100; i++ {
		pids, err := ReadPidsErr(dir)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := os.WriteFile(filepath.Join(to, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("move process %d: %w", pid, err)
			}
		}
	}
	return fmt.Errorf("processes still in %s after 100 rounds of moves: %w", dir, unix.EAGAIN)
}

func IsDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
