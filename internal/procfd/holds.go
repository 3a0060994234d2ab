//go:build linux

package procfd

import (
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// File is a file by device and inode.
type File struct{ Dev, Ino uint64 }

// HoldsForWriting says whether process pid has a descriptor open for
// writing on one of files (the FIFOs whose writers the shim keeps until a
// process's output has been copied), in one pass over its descriptors.
func HoldsForWriting(pid int, files []File) bool {
	p := "/proc/" + strconv.Itoa(pid)
	var st unix.Stat_t
	for _, fd := range fdNames(p) {
		if unix.Stat(p+"/fd/"+fd, &st) != nil || !slices.Contains(files, File{Dev: st.Dev, Ino: st.Ino}) {
			continue
		}
		if flags, _, ok := fdFlags(p, fd); ok && flags&unix.O_ACCMODE != unix.O_RDONLY {
			return true
		}
	}
	return false
}

// fdNames lists the descriptors of the process whose /proc directory is p.
func fdNames(p string) []string {
	f, err := os.Open(p + "/fd")
	if err != nil {
		return nil
	}
	defer f.Close()
	fds, _ := f.Readdirnames(-1)
	return fds
}

// fdFlags reads the open flags and mount id of descriptor fd of the
// process whose /proc directory is p.
func fdFlags(p, fd string) (flags int, mnt uint64, ok bool) {
	b, err := os.ReadFile(p + "/fdinfo/" + fd)
	if err != nil {
		return 0, 0, false
	}
	return parseFdinfo(b)
}
