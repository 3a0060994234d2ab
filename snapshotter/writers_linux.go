//go:build linux

package snapshotter

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
)

// maxWriters bounds the writers a refused seal names.
const maxWriters = 32

// findWriters names the processes that hold a file of the given mounts
// (of one superblock) open for writing: what makes the kernel refuse to
// make such a mount read-only. Each descriptor of each process is checked
// with one statx of its /proc link, which gives the mount the file was
// opened through; only those on the mounts have their open flags read
// (fdinfo). If no descriptor is found, shared writable mappings of the
// superblock's device (/proc/*/maps) are looked for: a mapping keeps its
// file open after its descriptor is closed. Only called once a seal was
// refused; it costs a few syscalls per open file on the machine.
func findWriters(ms []nsMount) []branch.Writer {
	if len(ms) == 0 {
		return nil
	}
	ids := map[uint64]bool{}
	for _, m := range ms {
		ids[m.id] = true
	}
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	var out []branch.Writer
	add := func(name, path string) {
		pid, _ := strconv.Atoi(name)
		for _, w := range out {
			if w.Pid == pid && w.Path == path {
				return
			}
		}
		b, _ := os.ReadFile("/proc/" + name + "/comm")
		out = append(out, branch.Writer{Pid: pid, Command: strings.TrimSpace(string(b)), Path: path})
	}
	var stx unix.Statx_t
	for _, name := range names {
		if _, err := strconv.Atoi(name); err != nil {
			continue
		}
		fdDir := "/proc/" + name + "/fd/"
		f, err := os.Open(fdDir)
		if err != nil {
			continue
		}
		fds, _ := f.Readdirnames(-1)
		f.Close()
		for _, fd := range fds {
			if unix.Statx(unix.AT_FDCWD, fdDir+fd, unix.AT_STATX_DONT_SYNC, unix.STATX_MNT_ID, &stx) != nil || !ids[stx.Mnt_id] {
				continue
			}
			b, err := os.ReadFile("/proc/" + name + "/fdinfo/" + fd)
			if err != nil {
				continue
			}
			flags, mnt, ok := parseFdinfo(b)
			if !ok || !ids[mnt] || flags&unix.O_ACCMODE == unix.O_RDONLY {
				continue
			}
			if path, err := os.Readlink(fdDir + fd); err == nil {
				add(name, path)
			}
		}
		if len(out) >= maxWriters {
			return out
		}
	}
	if len(out) > 0 {
		return out
	}
	dev := fmt.Sprintf("%02x:%02x", ms[0].major, ms[0].minor)
	for _, name := range names {
		if _, err := strconv.Atoi(name); err != nil {
			continue
		}
		f, err := os.Open("/proc/" + name + "/maps")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// address perms offset dev inode path
			fs := strings.Fields(sc.Text())
			if len(fs) >= 6 && len(fs[1]) == 4 && fs[1][1] == 'w' && fs[1][3] == 's' && fs[3] == dev {
				add(name, strings.Join(fs[5:], " ")+" (mapped)")
			}
		}
		f.Close()
		if len(out) >= maxWriters {
			break
		}
	}
	return out
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
