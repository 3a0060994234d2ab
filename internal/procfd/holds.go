//go:build linux

package procfd

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// HoldsForWriting says whether process pid has a descriptor open for
// writing on the file of device dev and inode ino (a FIFO whose writer
// the shim keeps until a process's output has been copied).
func HoldsForWriting(pid int, dev, ino uint64) bool {
	p := "/proc/" + strconv.Itoa(pid)
	f, err := os.Open(p + "/fd")
	if err != nil {
		return false
	}
	fds, _ := f.Readdirnames(-1)
	f.Close()
	var st unix.Stat_t
	for _, fd := range fds {
		if unix.Stat(p+"/fd/"+fd, &st) != nil || st.Dev != dev || st.Ino != ino {
			continue
		}
		b, err := os.ReadFile(p + "/fdinfo/" + fd)
		if err != nil {
			continue
		}
		if flags, _, ok := parseFdinfo(b); ok && flags&unix.O_ACCMODE != unix.O_RDONLY {
			return true
		}
	}
	return false
}
