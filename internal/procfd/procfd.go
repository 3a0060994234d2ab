//go:build linux

// Package procfd finds, through /proc, the processes that hold files open
// for writing on given mounts: what makes the kernel refuse to make a mount
// read-only. The snapshotter names them when a seal is refused; the shim
// asks whether a sandbox's own processes are among them.
package procfd

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Mounts is a set of mount ids (mountinfo's first field, statx's
// STATX_MNT_ID): the mounts whose writers are looked for.
type Mounts map[uint64]bool

// Writer is a process that holds a file open for writing.
type Writer struct {
	Pid     int
	Command string // its comm
	// Path is the file as /proc/<pid>/fd/<n> names it, or as
	// /proc/<pid>/maps does followed by " (mapped)".
	Path string
}

// Writers returns the processes that hold a file on one of mounts open for
// writing, looking at every process on the machine and stopping once limit
// writers are found (0: no limit; a process's descriptors are all looked
// at, so a few more may be returned). It costs one statx per open
// descriptor: each /proc link's mount id says whether the file is on the
// mounts, and only those have their open flags read (fdinfo).
func Writers(mounts Mounts, limit int) []Writer {
	return scan(allPids(), mounts, limit, true)
}

// WritersAmong is Writers, looking only at the processes pids.
func WritersAmong(pids []int, mounts Mounts, limit int) []Writer {
	return scan(pids, mounts, limit, true)
}

// AnyWriterAmong says whether one of pids holds a file on one of mounts
// open for writing. It stops at the first such descriptor and names
// nothing.
func AnyWriterAmong(pids []int, mounts Mounts) bool {
	return len(scan(pids, mounts, 1, false)) > 0
}

// MappedWriters returns the processes with a shared writable mapping of a
// file on the device major:minor, stopping once limit are found (0: no
// limit). A mapping keeps its file open for writing after its descriptor
// is closed, so this finds what Writers cannot.
func MappedWriters(major, minor int, limit int) []Writer {
	var out []Writer
	sharedWritable(major, minor, func(pid int, _ uint64, path string) bool {
		out = add(out, pid, path+" (mapped)")
		return limit <= 0 || len(out) < limit
	})
	return out
}

// MappedInodes returns the inode numbers of the files on the device
// major:minor that some process maps shared and writable. For a file of an
// overlay mount the mapping is of the real file, so these are the numbers
// of the upper directory's files.
func MappedInodes(major, minor int) map[uint64]bool {
	out := map[uint64]bool{}
	sharedWritable(major, minor, func(_ int, ino uint64, _ string) bool {
		out[ino] = true
		return true
	})
	return out
}

// sharedWritable calls fn for each shared writable mapping of a file on
// the device major:minor in every process, until fn returns false.
func sharedWritable(major, minor int, fn func(pid int, ino uint64, path string) bool) {
	dev := fmt.Sprintf("%02x:%02x", major, minor)
	for _, pid := range allPids() {
		f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/maps")
		if err != nil {
			continue
		}
		more := true
		sc := bufio.NewScanner(f)
		for more && sc.Scan() {
			// address perms offset dev inode path
			fs := strings.Fields(sc.Text())
			if len(fs) >= 6 && len(fs[1]) == 4 && fs[1][1] == 'w' && fs[1][3] == 's' && fs[3] == dev {
				ino, _ := strconv.ParseUint(fs[4], 10, 64)
				more = fn(pid, ino, strings.Join(fs[5:], " "))
			}
		}
		f.Close()
		if !more {
			return
		}
	}
}

// scan looks at the descriptors of pids for files on mounts open for
// writing. Unless named, it returns at the first one found, with only its
// pid.
func scan(pids []int, mounts Mounts, limit int, named bool) []Writer {
	if len(mounts) == 0 {
		return nil
	}
	var (
		out []Writer
		stx unix.Statx_t
	)
	for _, pid := range pids {
		p := "/proc/" + strconv.Itoa(pid)
		for _, fd := range fdNames(p) {
			link := p + "/fd/" + fd
			if unix.Statx(unix.AT_FDCWD, link, unix.AT_STATX_DONT_SYNC, unix.STATX_MNT_ID, &stx) != nil || !mounts[stx.Mnt_id] {
				continue
			}
			flags, mnt, ok := fdFlags(p, fd)
			if !ok || !mounts[mnt] || flags&unix.O_ACCMODE == unix.O_RDONLY {
				continue
			}
			if !named {
				return []Writer{{Pid: pid}}
			}
			if path, err := os.Readlink(link); err == nil {
				out = add(out, pid, path)
			}
		}
		if limit > 0 && len(out) >= limit {
			return out
		}
	}
	return out
}

// add appends pid's writer of path to out, once.
func add(out []Writer, pid int, path string) []Writer {
	for _, w := range out {
		if w.Pid == pid && w.Path == path {
			return out
		}
	}
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return append(out, Writer{Pid: pid, Command: strings.TrimSpace(string(b)), Path: path})
}

// allPids lists the processes in /proc.
func allPids() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	pids := make([]int, 0, len(names))
	for _, name := range names {
		if pid, err := strconv.Atoi(name); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// parseFdinfo reads the open flags (octal) and mount id of an fdinfo file.
func parseFdinfo(b []byte) (flags int, mnt uint64, ok bool) {
	var haveFlags, haveMnt bool
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		k, v, found := bytes.Cut(line, []byte{':'})
		if !found {
			continue
		}
		v = bytes.TrimSpace(v)
		switch string(k) {
		case "flags":
			f, err := strconv.ParseInt(string(v), 8, 64)
			flags, haveFlags = int(f), err == nil
		case "mnt_id":
			m, err := strconv.ParseUint(string(v), 10, 64)
			mnt, haveMnt = m, err == nil
		}
		if haveFlags && haveMnt {
			return flags, mnt, true
		}
	}
	return 0, 0, false
}
