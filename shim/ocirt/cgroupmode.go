//go:build linux

package ocirt

// CRIU's cgroup handling costs a dump and each restore a mount of every
// cgroup hierarchy (about 10 ms of the processes' pause on a cgroup v1
// node, where there are ten), to record and restore the cgroup of each
// process, their properties, and a cgroup namespace. A sandbox whose
// processes all share the init's cgroup, with no cgroup namespace of its
// own, needs none of it: the runtime puts CRIU in the branch's cgroup, and
// what it restores stays there. Such a dump is made with CRIU's cgroup
// handling off, and says so in the image (cgroupsIgnored), so that its
// restores skip it too; any other is dumped and restored as before.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/branchbox/branchbox/internal/procfd"
)

// cgroupsIgnored, in an image, marks a dump made without CRIU's cgroup
// handling.
const cgroupsIgnored = "cgroups-ignored"

// cgroupsFlat says whether every thread of pid and its descendants is in
// pid's cgroups, and pid in this process's cgroup namespace.
func cgroupsFlat(pid int) bool {
	ns := func(p string) string { s, _ := os.Readlink(filepath.Join(p, "ns", "cgroup")); return s }
	if ns("/proc/self") == "" || ns("/proc/self") != ns(fmt.Sprintf("/proc/%d", pid)) {
		return false
	}
	want, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	// Each process's threads, as the tree is walked: a process gone, or
	// one thread elsewhere, and the tree is not flat.
	return procfd.Tree(pid, func(p int) bool {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", p))
		if err != nil || len(tasks) == 0 {
			return false
		}
		for _, t := range tasks {
			cg, err := os.ReadFile(filepath.Join(t, "cgroup"))
			if err != nil || !bytes.Equal(cg, want) {
				return false
			}
		}
		return true
	}) != nil
}
