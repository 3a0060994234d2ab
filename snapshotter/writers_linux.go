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
// (of one superblock) open for writing, from /proc/*/fdinfo (a file's
// mnt_id and open flags), or mapped shared and writable, from
// /proc/*/maps (the superblock's device): what makes the kernel refuse
// to make such a mount read-only. Only called once a seal was refused.
func findWriters(ms []nsMount) []branch.Writer {
	if len(ms) == 0 {
		return nil
	}
	ids := map[uint64]bool{}
	for _, m := range ms {
		ids[m.id] = true
	}
	dev := fmt.Sprintf("%02x:%02x", ms[0].major, ms[0].minor)
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	var out []branch.Writer
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		comm := ""
		add := func(path string) {
			if comm == "" {
				b, _ := os.ReadFile("/proc/" + name + "/comm")
				comm = strings.TrimSpace(string(b))
			}
			for _, w := range out {
				if w.Pid == pid && w.Path == path {
					return
				}
			}
			out = append(out, branch.Writer{Pid: pid, Command: comm, Path: path})
		}
		fdDir := "/proc/" + name + "/fd/"
		fds, err := os.ReadDir("/proc/" + name + "/fdinfo")
		if err != nil {
			continue
		}
		for _, fd := range fds {
			b, err := os.ReadFile("/proc/" + name + "/fdinfo/" + fd.Name())
			if err != nil {
				continue
			}
			flags, mnt, ok := parseFdinfo(b)
			if !ok || !ids[mnt] || flags&unix.O_ACCMODE == unix.O_RDONLY {
				continue
			}
			path, err := os.Readlink(fdDir + fd.Name())
			if err != nil {
				continue
			}
			add(path)
		}
		if f, err := os.Open("/proc/" + name + "/maps"); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				// address perms offset dev inode path
				fs := strings.Fields(sc.Text())
				if len(fs) >= 6 && len(fs[1]) == 4 && fs[1][1] == 'w' && fs[1][3] == 's' && fs[3] == dev {
					add(strings.Join(fs[5:], " ") + " (mapped)")
				}
			}
			f.Close()
		}
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
