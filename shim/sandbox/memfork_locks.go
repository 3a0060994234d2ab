//go:build linux

package sandbox

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/procfd"
)

// A memory fork dumps the file locks its processes hold (flock, fcntl:
// SQLite's, a pidfile's), and each copy takes them again on its copy of
// the file: its rootfs and tmpfs mounts are its own. A file of a mount
// the copies share with the sandbox (a bind mount, a volume) is the same
// file, whose lock the sandbox still holds: CRIU's restore would wait on
// it. Such a lock is refused before the dump.

// fileLock is a lock of /proc/locks: the holder and the locked inode.
type fileLock struct {
	pid          int
	major, minor uint32
	ino          uint64
}

// sharedLocks names the locks held by processes of tree on files of mounts
// the copies would share (every mount but the root and the spec's tmpfs
// mounts, seen from initPid).
func sharedLocks(initPid int, tree map[int]bool, spec *specs.Spec) []string {
	locks := treeLocks(tree)
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
		fd, path, mnt, ok := lockedFd(l)
		point, known := mounts[mnt]
		if !ok || !known || own[point] {
			continue // a mount of a nested mount namespace: left to CRIU
		}
		out = append(out, fmt.Sprintf("process %d (%s) holds a lock on %s (descriptor %s), a file of the mount at %s, which its copies would share with it (a bind mount or a volume): no copy could take the lock again; release it first",
			l.pid, comm(l.pid), path, fd, point))
	}
	return out
}

// treeLocks reads the locks that processes of tree hold from /proc/locks
// (not those they wait for, the "->" lines).
func treeLocks(tree map[int]bool) []fileLock {
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return nil
	}
	var out []fileLock
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// 1: FLOCK  ADVISORY  WRITE 7758 fe:00:999434 0 EOF
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[1] == "->" {
			continue
		}
		pid, err := strconv.Atoi(f[4])
		if err != nil || !tree[pid] {
			continue
		}
		id := strings.Split(f[5], ":")
		if len(id) != 3 {
			continue
		}
		major, err1 := strconv.ParseUint(id[0], 16, 32)
		minor, err2 := strconv.ParseUint(id[1], 16, 32)
		ino, err3 := strconv.ParseUint(id[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		out = append(out, fileLock{pid: pid, major: uint32(major), minor: uint32(minor), ino: ino})
	}
	return out
}

// lockedFd finds a descriptor of the lock's holder on the locked inode:
// its number, its path and the id of the mount it was opened on.
func lockedFd(l fileLock) (fd, path string, mnt int, ok bool) {
	dir := fmt.Sprintf("/proc/%d/fd", l.pid)
	fds, _ := os.ReadDir(dir)
	for _, e := range fds {
		var st unix.Stat_t
		p := dir + "/" + e.Name()
		if unix.Stat(p, &st) != nil || st.Ino != l.ino || unix.Major(st.Dev) != l.major || unix.Minor(st.Dev) != l.minor {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", l.pid, e.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			if v, found := strings.CutPrefix(line, "mnt_id:"); found {
				if mnt, err = strconv.Atoi(strings.TrimSpace(v)); err == nil {
					path, _ = os.Readlink(p)
					return e.Name(), path, mnt, true
				}
			}
		}
	}
	return "", "", 0, false
}
