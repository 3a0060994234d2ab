//go:build linux

package procfd

import (
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"
)

// RootMounts returns the mounts, in pid's mount namespace, of the
// filesystem that is pid's root: every mount a write to pid's root could
// go through there.
func RootMounts(pid int) (Mounts, error) {
	proc := "/proc/" + strconv.Itoa(pid)
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, proc+"/root", 0, unix.STATX_MNT_ID, &stx); err != nil {
		return nil, fmt.Errorf("mount of %s/root: %w", proc, err)
	}
	infos, err := Mountinfo(pid)
	if err != nil {
		return nil, err
	}
	ids := Mounts{}
	for _, root := range infos {
		if uint64(root.ID) != stx.Mnt_id {
			continue
		}
		for _, m := range infos {
			if m.Major == root.Major && m.Minor == root.Minor {
				ids[uint64(m.ID)] = true
			}
		}
	}
	return ids, nil
}
