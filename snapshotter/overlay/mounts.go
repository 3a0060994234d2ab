//go:build linux

// Package overlay is the snapshotter's overlay mount code: where an upper
// is mounted (the host's mount table, and a cache of it), the seal of a
// live overlay (its superblock remounted read-only on a thread of its own,
// or each of its mounts in every mount namespace made read-only), the
// processes whose open files refuse a seal, and the detaching of the mounts
// of discarded layers. It knows nothing of snapshots or branch trees.
package overlay

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Live is where the host sees an overlay with a given upper.
type Live struct {
	Target   string // a mount point of it; "" if not mounted
	Readonly bool   // the superblock is read-only
	Options  string // per-mount options of that mount point
}

// Table is the overlay mounts of this mount namespace, read once for
// an operation that asks about several layers.
type Table []*mountinfo.Info

func ReadTable() (Table, error) {
	infos, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("overlay"))
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return infos, nil
}

// Live finds the overlay mounted with upper as its upper directory. An
// upper is in use by at most one overlay superblock, so the first mount
// point found speaks for all of them.
func (t Table) Live(upper string) Live {
	for _, m := range t {
		if UpperIs(m, upper) {
			return Live{Target: m.Mountpoint, Readonly: hasMountOpt(m.VFSOptions, "ro"), Options: m.Options}
		}
	}
	return Live{}
}

// Detach lazily unmounts every overlay of the table whose upper is upper.
func (t Table) Detach(ctx context.Context, upper string) {
	var found []*mountinfo.Info
	for _, m := range t {
		if UpperIs(m, upper) {
			found = append(found, m)
		}
	}
	detachAll(ctx, found)
}

// Find finds the overlay mounted (in this mount namespace) with upper
// as its upper directory.
func Find(upper string) (Live, error) {
	t, err := ReadTable()
	if err != nil {
		return Live{}, err
	}
	return t.Live(upper), nil
}

func hasMountOpt(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}

// Remount makes the overlay superblock mounted at live.target
// read-only or writable. Changing the superblock, not the mount, reaches
// every mount of it at once, including the container's own root in its
// mount namespace. The per-mount flags (live.options, as the mount table
// read them) are passed back unchanged, since a remount resets them.
func Remount(live Live, readonly bool) error {
	target := live.Target
	flags := uintptr(unix.MS_REMOUNT)
	for _, o := range strings.Split(live.Options, ",") {
		switch o {
		case "nosuid":
			flags |= unix.MS_NOSUID
		case "nodev":
			flags |= unix.MS_NODEV
		case "noexec":
			flags |= unix.MS_NOEXEC
		case "noatime":
			flags |= unix.MS_NOATIME
		case "nodiratime":
			flags |= unix.MS_NODIRATIME
		case "relatime":
			flags |= unix.MS_RELATIME
		case "strictatime":
			flags |= unix.MS_STRICTATIME
		}
	}
	if readonly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		if err == unix.EBUSY && readonly {
			return fmt.Errorf("remount %s read-only: %w: %w", target, ErrSuperblockBusy, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("remount %s (read-only: %v): %w", target, readonly, err)
	}
	return nil
}

// ErrSuperblockBusy is a superblock's read-only remount refused: a file
// is open for writing on some mount of it, or it holds a file unlinked
// while open (the kernel refuses both alike). The per-mount seal
// (sealmounts.go) is refused only for the first, and names it.
var ErrSuperblockBusy = errors.New("a file is open for writing on it, or was unlinked while open")

// ProbeRefused says whether a write through target is refused with EROFS.
// The write sets an attribute both only if it exists and only if it does
// not, so it changes nothing when let through (ENODATA or EEXIST), even
// if the sandbox made an attribute of that name.
func ProbeRefused(target string) bool {
	return unix.Setxattr(target, "user.branchbox.seal-probe", []byte{0}, unix.XATTR_CREATE|unix.XATTR_REPLACE) == unix.EROFS
}

// DetachUnder lazily unmounts everything mounted below dir and every
// overlay whose upper lies below dir.
func DetachUnder(ctx context.Context, dir string) {
	dir = filepath.Clean(dir)
	under := func(p string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	detachMatching(ctx, func(m *mountinfo.Info) bool {
		if under(m.Mountpoint) {
			return true
		}
		if m.FSType != "overlay" {
			return false
		}
		u := upperOf(m)
		return filepath.IsAbs(u) && under(filepath.Clean(u))
	})
}

func detachMatching(ctx context.Context, match func(*mountinfo.Info) bool) {
	infos, err := mountinfo.GetMounts(func(m *mountinfo.Info) (bool, bool) { return !match(m), false })
	if err != nil {
		log.G(ctx).WithError(err).Warn("read mountinfo")
		return
	}
	detachAll(ctx, infos)
}

func detachAll(ctx context.Context, infos []*mountinfo.Info) {
	// Deepest first, so nested mounts go before their parents.
	sort.Slice(infos, func(i, j int) bool { return len(infos[i].Mountpoint) > len(infos[j].Mountpoint) })
	for _, m := range infos {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			log.G(ctx).WithError(err).WithField("mount", m.Mountpoint).Warn("detach mount of a discarded layer")
			continue
		}
		log.G(ctx).WithField("mount", m.Mountpoint).Debug("detached mount of a discarded layer")
	}
}
