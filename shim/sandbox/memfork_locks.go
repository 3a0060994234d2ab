//go:build linux

package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/branchbox/branchbox/internal/procfd"
)

// A memory fork dumps the file locks its processes hold (flock, fcntl:
// SQLite's, a pidfile's), and each copy takes them again on its copy of
// the file: its rootfs and tmpfs mounts are its own. A file of a mount
// the copies share with the sandbox (a bind mount, a volume) is the same
// file, whose lock the sandbox still holds: CRIU's restore would wait on
// it. Such a lock is refused before the dump.

// heldLock is a lock a process of the tree holds through one of its
// descriptors: the descriptor, its path and the mount it was opened on.
type heldLock struct {
	pid      int
	fd, path string
	mnt      int
}

// sharedLocks names the locks (unforkable found them) held on files of
// mounts the copies would share (every mount but the root and the spec's
// tmpfs mounts, seen from initPid).
func sharedLocks(initPid int, locks []heldLock, spec *specs.Spec) []string {
	if len(locks) == 0 {
		return nil
	}
	own := map[string]bool{"/": true}
	if spec != nil {
		for _, m := range spec.Mounts {
			if m.Type == "tmpfs" {
				own[m.Destination] = true
			}
		}
	}
	infos, err := procfd.Mountinfo(initPid)
	if err != nil {
		return nil // the dump will say what it meets
	}
	mounts := map[int]string{}
	for _, m := range infos {
		mounts[m.ID] = m.Mountpoint
	}
	var out []string
	for _, l := range locks {
		point, known := mounts[l.mnt]
		if !known || own[point] {
			continue // a mount of a nested mount namespace: left to CRIU
		}
		out = append(out, fmt.Sprintf("process %d (%s) holds a lock on %s (descriptor %s), a file of the mount at %s, which its copies would share with it (a bind mount or a volume): no copy could take the lock again; release it first",
			l.pid, comm(l.pid), l.path, l.fd, point))
	}
	return out
}

// lockOf says whether descriptor fd of process pid, a file at path, holds
// a lock, from the "lock:" lines of its fdinfo, as CRIU finds them. Not
// from /proc/locks: each read of it takes the kernel's file_rwsem for
// writing, which waits for an RCU grace period, 2.5-11 ms on a fork's path
// here.
func lockOf(pid int, fd, path string) (heldLock, bool) {
	if !strings.HasPrefix(path, "/") {
		return heldLock{}, false // a pipe, a socket, an anonymous inode: no lock
	}
	info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd))
	if err != nil || !bytes.Contains(info, []byte("\nlock:")) {
		return heldLock{}, false
	}
	for _, line := range strings.Split(string(info), "\n") {
		if v, ok := strings.CutPrefix(line, "mnt_id:"); ok {
			if mnt, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return heldLock{pid: pid, fd: fd, path: path, mnt: mnt}, true
			}
		}
	}
	return heldLock{}, false
}
