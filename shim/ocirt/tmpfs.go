//go:build linux

package ocirt

// A container's tmpfs mounts (/dev, /dev/shm, /run, the masked
// directories' empty ones) are most of what CRIU spends on the dump of a
// small tree: it archives each with a fork and exec of tar and of gzip,
// about 5 ms a mount with the processes stopped, and every restore
// extracts each again the same way. A small one (at most tmpfsCopyBytes in
// at most tmpfsCopyEntries entries) is dumped as an external mount
// instead: the runtime archives its content into the image itself,
// in-process, while CRIU holds the processes stopped (its post-dump
// notification, so that the copy is of the same instant as the memory),
// and a restore mounts a new tmpfs with the same options, fills it from
// that archive and gives it to CRIU as the external mount's source
// (tmpfs_restore.go). Larger ones are left to CRIU, whose tar runs in the
// branch's cgroup: what the runtime copies is charged to the shim, so it
// is kept small.

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
	"github.com/moby/sys/mountinfo"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/procfd"
	"github.com/branchbox/branchbox/internal/safeopen"
)

const (
	// tmpfsIndex, in an image, lists the tmpfs mounts the runtime copied
	// (JSON, []tmpfsMount).
	tmpfsIndex = "branchbox-tmpfs.json"
	// tmpfsCopyBytes and tmpfsCopyEntries bound the content of a tmpfs
	// mount the runtime copies itself.
	tmpfsCopyBytes   = 256 << 10
	tmpfsCopyEntries = 1024
)

// errTmpfsGrew is a copied mount that outgrew the bounds between the scan
// and the dump: the dump is made again with CRIU archiving it.
var errTmpfsGrew = errors.New("a tmpfs mount outgrew what the runtime copies itself during the dump")

// tmpfsMount is a tmpfs of the container the runtime copied: one
// superblock, mounted whole at one or more places (runc masks directories
// with one read-only tmpfs mounted at each).
type tmpfsMount struct {
	// Mountpoints are where it is mounted in the container, each the key
	// of an external mount.
	Mountpoints []string `json:"mountpoints"`
	// File is the archive of its content in the image.
	File string `json:"file"`
	// Data is its superblock's options (size=, mode=, ...), Flags its
	// first mount's (MS_NOSUID, MS_RDONLY, ...: CRIU gives each mount its
	// own from the image); ReadOnly says the superblock is read-only.
	Data     string  `json:"data"`
	Flags    uintptr `json:"flags"`
	ReadOnly bool    `json:"readOnly,omitempty"`

	id int // its first mount's id, while dumping
}

// mountFlags are the flags of a mount's per-mount options as mountinfo
// shows them, and whether the runtime knows each. mountinfo shows neither
// relatime nor noatime for a strictatime mount, whose copy must be one
// too: CRIU sets each mount's flags from the image, and in a user
// namespace it may not change a mount's atime flags.
func mountFlags(options string) (uintptr, bool) {
	var flags uintptr
	for _, o := range strings.Split(options, ",") {
		f, ok := mountFlag(o)
		if !ok {
			return 0, false
		}
		flags |= f
	}
	if flags&(unix.MS_RELATIME|unix.MS_NOATIME) == 0 {
		flags |= unix.MS_STRICTATIME
	}
	return flags, true
}

// mountFlag is the flag of a per-mount option mountinfo shows ("rw": 0),
// and whether it is one the runtime knows.
func mountFlag(o string) (uintptr, bool) {
	switch o {
	case "rw":
		return 0, true
	case "ro":
		return unix.MS_RDONLY, true
	case "nosuid":
		return unix.MS_NOSUID, true
	case "nodev":
		return unix.MS_NODEV, true
	case "noexec":
		return unix.MS_NOEXEC, true
	case "relatime":
		return unix.MS_RELATIME, true
	case "noatime":
		return unix.MS_NOATIME, true
	case "nodiratime":
		return unix.MS_NODIRATIME, true
	case "strictatime":
		return unix.MS_STRICTATIME, true
	case "sync":
		return unix.MS_SYNCHRONOUS, true
	}
	return 0, false
}

// smallTmpfs is the tmpfs superblocks of pid's mount namespace the runtime
// can copy: mounted whole, private, at places not already external, and
// small.
func smallTmpfs(pid int, external map[string]bool) ([]tmpfsMount, error) {
	infos, err := procfd.Mountinfo(pid)
	if err != nil {
		return nil, err
	}
	var order [][2]int
	bySB := map[[2]int][]*mountinfo.Info{}
	for _, m := range infos {
		if external[m.Mountpoint] {
			continue
		}
		sb := [2]int{m.Major, m.Minor}
		if bySB[sb] == nil {
			order = append(order, sb)
		}
		bySB[sb] = append(bySB[sb], m)
	}
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	var out []tmpfsMount
	for _, sb := range order {
		t, ok := copyable(bySB[sb])
		if !ok {
			continue
		}
		t.File = fmt.Sprintf("branchbox-tmpfs-%d.tar", len(out))
		// The processes still run: what they change under the scan, or
		// too much content, leaves the mount to CRIU.
		if err := t.archive(root, nil); err != nil {
			logrus.WithError(err).WithField("mount", t.Mountpoints[0]).Debug("tmpfs left to criu")
			continue
		}
		out = append(out, t)
	}
	return out, nil
}

// copyable is the copy of a tmpfs superblock's mounts, if the runtime
// can make it: each mount whole, private, with options it knows.
func copyable(mounts []*mountinfo.Info) (tmpfsMount, bool) {
	t := tmpfsMount{id: mounts[0].ID}
	for _, m := range mounts {
		if m.FSType != "tmpfs" || m.Root != "/" || m.Optional != "" || strings.ContainsAny(m.Mountpoint, "\"\n") {
			return t, false
		}
		t.Mountpoints = append(t.Mountpoints, m.Mountpoint)
	}
	flags, ok := mountFlags(mounts[0].Options)
	if !ok {
		return t, false
	}
	t.Flags = flags
	var data []string
	for _, o := range strings.Split(mounts[0].VFSOptions, ",") {
		switch o {
		case "rw":
		case "ro":
			t.ReadOnly = true
		case "seclabel":
		default:
			data = append(data, o)
		}
	}
	t.Data = strings.Join(data, ",")
	return t, true
}

// tmpfsNotify copies the mounts into the image when CRIU has dumped the
// processes and holds them stopped.
type tmpfsNotify struct {
	criu.NoNotify
	pid    int
	mounts []tmpfsMount
	images string
}

func (n *tmpfsNotify) PostDump() error {
	if len(n.mounts) == 0 {
		return nil
	}
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", n.pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	for _, m := range n.mounts {
		f, err := os.OpenFile(filepath.Join(n.images, m.File), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		err = m.archive(root, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("tmpfs %s: %w", m.Mountpoints[0], err)
		}
	}
	index, err := json.Marshal(n.mounts)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(n.images, tmpfsIndex), index, 0o600)
}

// archive writes the mount's content as a tar to w (the root, "./", first),
// or errTmpfsGrew if it holds more than the bounds; with w nil it only
// measures the content against the bounds (its files are not read). It reaches the mount
// from the container's root without following a symlink, checks that it
// reached the mount's root, and does not descend into another mount: a
// file bound over one of its entries is archived empty, a directory a
// mount covers as a directory.
func (m *tmpfsMount) archive(root int, w io.Writer) error {
	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	dir, err := unix.Openat2(root, m.Mountpoints[0], how)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	var stx unix.Statx_t
	if err := unix.Statx(dir, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err != nil {
		return err
	}
	if int(stx.Mnt_id) != m.id || stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return fmt.Errorf("%s is no longer the mount's root", m.Mountpoints[0])
	}
	var st unix.Stat_t
	if err := unix.Fstat(dir, &st); err != nil {
		return err
	}
	a := &archiver{dev: st.Dev, links: map[uint64]string{}}
	if w != nil {
		a.tw = tar.NewWriter(w)
	}
	if err := a.header("./", &st, tar.TypeDir, 0, ""); err != nil {
		return err
	}
	if err := a.dir(dir, "."); err != nil || a.tw == nil {
		return err
	}
	return a.tw.Close()
}

type archiver struct {
	tw      *tar.Writer // nil: measuring
	dev     uint64
	links   map[uint64]string
	bytes   int64
	entries int
}

func (a *archiver) header(name string, st *unix.Stat_t, typ byte, size int64, link string) error {
	a.entries++
	a.bytes += size
	if a.entries > tmpfsCopyEntries || a.bytes > tmpfsCopyBytes {
		return errTmpfsGrew
	}
	if a.tw == nil {
		return nil
	}
	return a.tw.WriteHeader(&tar.Header{
		Typeflag: typ, Name: name, Linkname: link, Size: size,
		Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime:  time.Unix(st.Mtim.Unix()),
		Devmajor: int64(unix.Major(st.Rdev)), Devminor: int64(unix.Minor(st.Rdev)),
		Format: tar.FormatPAX,
	})
}

// dir archives the entries of the directory open at fd, named rel.
func (a *archiver) dir(fd int, rel string) error {
	d, err := unix.Dup(fd)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(d), rel)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := a.entry(fd, rel, n); err != nil {
			return err
		}
	}
	return nil
}

func (a *archiver) entry(dirfd int, rel, n string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	name := path.Join(rel, n)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := a.header(name+"/", &st, tar.TypeDir, 0, ""); err != nil || st.Dev != a.dev {
			return err
		}
		sub, err := safeopen.OpenBeneath(dirfd, n, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(sub)
		return a.dir(sub, name)
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		l, err := unix.Readlinkat(dirfd, n, buf)
		if err != nil {
			return err
		}
		return a.header(name, &st, tar.TypeSymlink, 0, string(buf[:l]))
	case unix.S_IFCHR:
		return a.header(name, &st, tar.TypeChar, 0, "")
	case unix.S_IFBLK:
		return a.header(name, &st, tar.TypeBlock, 0, "")
	case unix.S_IFIFO:
		return a.header(name, &st, tar.TypeFifo, 0, "")
	case unix.S_IFREG:
		return a.file(dirfd, n, name, &st)
	}
	return nil // a socket: CRIU binds it again, as its tar leaves it out
}

func (a *archiver) file(dirfd int, n, name string, st *unix.Stat_t) error {
	if st.Dev != a.dev {
		// A file bound over an entry: the entry, empty, not the file.
		return a.header(name, st, tar.TypeReg, 0, "")
	}
	if st.Nlink > 1 {
		if first, ok := a.links[st.Ino]; ok {
			return a.header(name, st, tar.TypeLink, 0, first)
		}
		a.links[st.Ino] = name
	}
	if err := a.header(name, st, tar.TypeReg, st.Size, ""); err != nil || a.tw == nil {
		return err
	}
	// Non-blocking: a fifo put in the file's place must not hang the open.
	fd, err := safeopen.OpenBeneath(dirfd, n, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var now unix.Stat_t
	if err := unix.Fstat(fd, &now); err != nil {
		return err
	}
	if now.Ino != st.Ino || now.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s changed while it was copied", name)
	}
	if _, err := io.CopyN(a.tw, f, st.Size); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
