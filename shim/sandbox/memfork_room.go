//go:build linux

package sandbox

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/shim/cgroup"
)

// imageMargin is room kept beside a memory image's estimate: CRIU's other
// images (files, mounts, the pipes' data) and its log.
const imageMargin = 16 << 20

// checkImageRoom refuses a dump of processes holding anon bytes of
// anonymous memory whose image would not fit in the filesystem of dir,
// where it is written (the sandbox's bundle, in containerd's state
// directory: a tmpfs sized by the node's memory on most nodes), before
// anything is stopped: CRIU would otherwise run out of space midway,
// with the processes stopped. The image holds about the tree's anonymous
// memory; a filesystem with more free than the node's memory is not
// looked at further.
func checkImageRoom(dir string, anon int64, what string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("%s: free space where its image is written: %w", what, err)
	}
	free := int64(st.Bavail) * st.Bsize
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil && free >= int64(si.Totalram)*int64(si.Unit) {
		return nil
	}
	if anon+imageMargin > free {
		// No path: a sandbox asking through its socket is not shown
		// the host's.
		return fmt.Errorf("%s: its processes hold about %s of memory and deleted files, and their image would not fit in the %s free where it is written, the sandbox's bundle in containerd's state directory (a tmpfs sized by the node's memory on most nodes): make room there, or do without --memory: %w",
			what, branch.Bytes(anon), branch.Bytes(free), errdefs.ErrResourceExhausted)
	}
	return nil
}

// treeAnon is the anonymous memory of the processes of tree.
func treeAnon(tree map[int]bool) int64 {
	var anon int64
	for pid := range tree {
		anon += anonymousBytes(pid)
	}
	return anon
}

// checkMemoryRoom refuses a memory fork whose copies of processes holding
// anon bytes of anonymous memory would not fit under the memory limits
// they are charged to: each branch's own (branchLimit, 0 for none), and
// those of the parent's cgroup path and the cgroups above it (the
// sandbox's, a pod's), which the branches share, nested below. Before,
// such a fork succeeded and the kernel then killed restored processes
// for want of memory: branches silently short of the processes they
// were forked for. parent names the branch forked ("the sandbox",
// "branch 3").
func checkMemoryRoom(ms []cgroup.Dir, path, parent string, anon int64, copies int, branchLimit int64, what string) error {
	if branchLimit > 0 && anon > branchLimit {
		return fmt.Errorf("%s: its processes hold about %s of memory, more than the %s memory limit asked for each branch: ask for more, or none: %w",
			what, branch.Bytes(anon), branch.Bytes(branchLimit), errdefs.ErrResourceExhausted)
	}
	need := anon * int64(copies)
	var t *cgroup.MemoryLevel
	for _, l := range cgroup.MemoryLimits(ms, path) {
		if need > l.Room() && (t == nil || l.Room() < t.Room()) {
			t = &l
		}
	}
	if t == nil {
		return nil
	}
	whose := parent + "'s cgroup"
	if t.Cgroup != filepath.Clean(path) {
		whose = "a cgroup above " + parent + "'s"
	}
	return fmt.Errorf("%s: %s of its processes' memory (about %s each) would need %s, and the memory limit of %s leaves %s of its %s: fork fewer branches, or raise the limit: %w",
		what, counted(copies, "copy", "copies"), branch.Bytes(anon), branch.Bytes(need), whose, branch.Bytes(max(t.Room(), 0)), branch.Bytes(t.Limit), errdefs.ErrResourceExhausted)
}

// anonymousBytes is a process's share of the anonymous memory CRIU dumps,
// from /proc/PID/smaps_rollup: Pss_Anon, so that pages a parent and its
// forked children share copy-on-write count once over the tree (a
// pre-forked server's workers), or Anonymous on a kernel without it
// (before 5.7); 0 for a process that is gone.
func anonymousBytes(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0
	}
	anon := int64(-1)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("Pss_Anon:")); ok {
			if kb, ok := kilobytes(v); ok {
				return kb
			}
		}
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("Anonymous:")); ok {
			if kb, ok := kilobytes(v); ok {
				anon = kb
			}
		}
	}
	return max(anon, 0)
}

// kilobytes reads a smaps value (" 156 kB") as bytes.
func kilobytes(v []byte) (int64, bool) {
	kb, err := strconv.ParseInt(string(bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(v), []byte("kB")))), 10, 64)
	return kb << 10, err == nil
}
