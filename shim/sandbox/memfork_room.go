//go:build linux

package sandbox

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
)

// imageMargin is room kept beside a memory image's estimate: CRIU's other
// images (files, mounts, the pipes' data) and its log.
const imageMargin = 16 << 20

// checkImageRoom refuses a dump of the process tree tree whose
// memory image would not fit in the filesystem of dir, where it is
// written (the sandbox's bundle, in containerd's state directory: a tmpfs
// sized by the node's memory on most nodes), before anything is stopped:
// CRIU would otherwise run out of space midway, with the processes
// stopped. The image holds about the tree's anonymous memory; a
// filesystem with more free than the node's memory is not looked at
// further.
func checkImageRoom(dir string, tree map[int]bool, what string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("%s: free space where its image is written: %w", what, err)
	}
	free := int64(st.Bavail) * st.Bsize
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil && free >= int64(si.Totalram)*int64(si.Unit) {
		return nil
	}
	var anon int64
	for pid := range tree {
		anon += anonymousBytes(pid)
	}
	if anon+imageMargin > free {
		// No path: a sandbox asking through its socket is not shown
		// the host's.
		return fmt.Errorf("%s: its processes hold about %s of memory, and their image would not fit in the %s free where it is written, the sandbox's bundle in containerd's state directory (a tmpfs sized by the node's memory on most nodes): make room there, or do without --memory: %w",
			what, branch.Bytes(anon), branch.Bytes(free), errdefs.ErrResourceExhausted)
	}
	return nil
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
