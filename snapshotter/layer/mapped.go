//go:build linux

package layer

import (
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/procfd"
	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// mappedFiles tells which files of an upper some process maps shared and
// writable through an overlay mount of it, on a filesystem where a write
// through such a mapping changes no ctime. The zero and nil values map
// nothing.
type mappedFiles struct {
	views []mappedView
}

// mappedView is one overlay mount of the upper: a descriptor of its root
// and the inodes, as the mount numbers them, that are mapped.
type mappedView struct {
	root int
	dev  uint64
	inos map[uint64]bool
}

// mappedUnseen returns the files of upper (open as fd) mapped shared and
// writable, where its filesystem needs it: on tmpfs, which has no
// writeback, no page is ever made read-only again to catch the next write
// through a mapping, so such a write changes no ctime (see protectMapped
// for the filesystems that have writeback). Each such file counts as
// changed, now and in the listing recorded, so a checkpoint copies it and
// a rollback to that checkpoint writes it back. A file mapped, written and
// unmapped between two checkpoints, with no other change, is still not seen
// there (docs/checkpoints.md).
//
// A mapping of an overlay file is listed (/proc/PID/maps) with the
// overlay's device and inode number, which for a file copied up is its
// lower file's, not the upper's: the upper's files are looked up through
// the mount to compare.
func mappedUnseen(fd int, upper string) *mappedFiles {
	var fs unix.Statfs_t
	if unix.Fstatfs(fd, &fs) != nil || fs.Type != unix.TMPFS_MAGIC {
		return nil
	}
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("overlay"))
	if err != nil {
		return nil
	}
	m := &mappedFiles{}
	for _, mi := range mounts {
		if !overlay.UpperIs(mi, upper) {
			continue
		}
		inos := procfd.MappedInodes(mi.Major, mi.Minor)
		if len(inos) == 0 {
			continue
		}
		root, err := unix.Open(mi.Mountpoint, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		m.views = append(m.views, mappedView{root: root, dev: unix.Mkdev(uint32(mi.Major), uint32(mi.Minor)), inos: inos})
	}
	return m
}

// has tells whether the upper's file at rel is mapped through a mount.
// rel is reached beneath the mount's root without following a link: the
// tree is the sandbox's.
func (m *mappedFiles) has(rel string) bool {
	if m == nil {
		return false
	}
	for _, v := range m.views {
		fd, err := unix.Openat2(v.root, rel, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if err != nil {
			continue
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err == nil && st.Dev == v.dev && v.inos[st.Ino] {
			return true
		}
	}
	return false
}

func (m *mappedFiles) close() {
	if m == nil {
		return
	}
	for _, v := range m.views {
		unix.Close(v.root)
	}
}
