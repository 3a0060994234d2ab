//go:build linux

package apply

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/safeopen"
)

// Copying: every entry the upper adds or changes is created in target
// under a temporary name and renamed over its final name, so a reader (or
// a crash) sees the old entry or the new one, never half of one.

func copyXattrs(srcDir int, srcName string, dstDir int, dstName string, names []string) error {
	for _, x := range names {
		v, err := getxattrAt(srcDir, srcName, x)
		if err == unix.ENODATA {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", x, err)
		}
		if err := setxattrAt(dstDir, dstName, x, v); err != nil {
			return fmt.Errorf("%s: %w", x, err)
		}
	}
	return nil
}

// note records rel's pre-image in the journal, if there is one.
func (a *applier) note(rel string) error {
	if a.opts.journal == nil {
		return nil
	}
	return a.opts.journal.note(rel)
}

// noteTemp records that a temporary tmp is made beside rel.
func (a *applier) noteTemp(rel, tmp string) {
	if a.opts.journal != nil {
		d, _ := splitRel(rel)
		a.opts.journal.noteTemp(join(d, tmp))
	}
}

func (a *applier) dropTemp() {
	if j := a.opts.journal; j != nil {
		j.temps = j.temps[:len(j.temps)-1]
	}
}

func (a *applier) hook(side, rel string) {
	if a.opts.beforeOpen != nil {
		a.opts.beforeOpen(side, rel)
	}
}

func (a *applier) tempName() string {
	a.tmpSeq++
	return a.tmpBase + strconv.Itoa(a.tmpSeq)
}

// replace creates the new entry under a fresh temporary name with create,
// then renames it over name, so readers see the old entry or the new one.
// A directory in the way is removed first (a type change).
func (a *applier) replace(tgtFd int, rel, name string, depth int, create func(tmp string) error) error {
	if err := a.note(rel); err != nil {
		return err
	}
	var tmp string
	for i := 0; ; i++ {
		tmp = a.tempName()
		a.noteTemp(rel, tmp)
		err := create(tmp)
		if err == nil {
			break
		}
		// Another entry holds the temporary name: try the next one.
		if errors.Is(err, unix.EEXIST) {
			a.dropTemp()
			if i < 100 {
				continue
			}
			return err
		}
		_ = unix.Unlinkat(tgtFd, tmp, 0)
		return err
	}
	tst, err := lstatAt(tgtFd, name)
	switch {
	case err == nil && tst.Mode&unix.S_IFMT == unix.S_IFDIR:
		if err := a.removeAll(tgtFd, name, rel, depth); err != nil {
			_ = unix.Unlinkat(tgtFd, tmp, 0)
			return err
		}
	case err == nil && a.inTargetUpper(rel):
		// Readers see the old entry or the new one, as with a rename; a
		// crash before the unlink leaves the old one under a temporary
		// name, which a resumed Apply removes.
		if err := unix.Renameat2(tgtFd, tmp, tgtFd, name, unix.RENAME_EXCHANGE); err == nil {
			if err := unix.Unlinkat(tgtFd, tmp, 0); err != nil {
				return fail(rel, "remove replaced entry", err)
			}
			return nil
		}
	}
	if err := unix.Renameat(tgtFd, tmp, tgtFd, name); err != nil {
		_ = unix.Unlinkat(tgtFd, tmp, 0)
		return fail(rel, "rename into place", err)
	}
	return nil
}

func (a *applier) file(upFd, tgtFd int, rel, name string, xattrs []string) error {
	// O_NONBLOCK: should the entry have become a fifo since the stat, the
	// open must not hang; the fstat below rejects it.
	a.hook("upper", rel)
	src, err := safeopen.OpenBeneath(upFd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return fail(rel, "open upper file", err)
	}
	defer unix.Close(src)
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return fail(rel, "stat upper file", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("apply %s: upper entry changed type during apply: %w", rel, errdefs.ErrAborted)
	}
	return a.replace(tgtFd, rel, name, 0, func(tmp string) error {
		dst, err := unix.Openat2(tgtFd, tmp, &unix.OpenHow{
			Flags:   unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Mode:    0o600,
			Resolve: safeopen.Resolve,
		})
		if err != nil {
			if err == unix.EEXIST {
				return err
			}
			return fail(rel, "create target file", err)
		}
		defer unix.Close(dst)
		n, end, err := a.copier.Data(src, dst, st.Size)
		if err != nil {
			return fail(rel, "copy data", err)
		}
		a.stats.Bytes += n
		// A trailing hole (or an upper file that shrank) needs the size set.
		if end != st.Size {
			if err := unix.Ftruncate(dst, st.Size); err != nil {
				return fail(rel, "truncate", err)
			}
		}
		// chown clears setuid bits and security.capability, so it comes
		// first; times come last since every other change moves ctime only.
		if err := unix.Fchown(dst, int(st.Uid), int(st.Gid)); err != nil {
			return fail(rel, "chown", err)
		}
		if err := unix.Fchmod(dst, st.Mode&0o7777); err != nil {
			return fail(rel, "chmod", err)
		}
		if err := copyXattrs(src, "", dst, "", xattrs); err != nil {
			return fail(rel, "set xattr", err)
		}
		ts := statTimes(&st)
		if err := futimens(dst, &ts); err != nil {
			return fail(rel, "set times", err)
		}
		a.stats.Files++
		return nil
	})
}

func (a *applier) symlink(upFd, tgtFd int, rel, name string, st *unix.Stat_t, xattrs []string) error {
	buf := make([]byte, max(st.Size+1, 64))
	var text string
	for {
		n, err := unix.Readlinkat(upFd, name, buf)
		if err != nil {
			return fail(rel, "read upper symlink", err)
		}
		if n < len(buf) {
			text = string(buf[:n])
			break
		}
		if len(buf) > unix.PathMax*2 {
			return invalid(rel, "symlink target longer than %d bytes", unix.PathMax)
		}
		buf = make([]byte, len(buf)*2)
	}
	return a.replace(tgtFd, rel, name, 0, func(tmp string) error {
		// The text is copied verbatim and never resolved.
		if err := unix.Symlinkat(text, tgtFd, tmp); err != nil {
			if err == unix.EEXIST {
				return err
			}
			return fail(rel, "create symlink", err)
		}
		if err := a.leafMeta(upFd, name, tgtFd, tmp, rel, st, xattrs, false); err != nil {
			return err
		}
		a.stats.Symlinks++
		return nil
	})
}

func (a *applier) special(upFd, tgtFd int, rel, name string, st *unix.Stat_t, xattrs []string) error {
	return a.replace(tgtFd, rel, name, 0, func(tmp string) error {
		if err := unix.Mknodat(tgtFd, tmp, st.Mode&unix.S_IFMT|0o600, int(st.Rdev)); err != nil {
			if err == unix.EEXIST {
				return err
			}
			return fail(rel, "mknod", err)
		}
		if err := a.leafMeta(upFd, name, tgtFd, tmp, rel, st, xattrs, true); err != nil {
			return err
		}
		a.stats.Devices++
		return nil
	})
}

// leafMeta sets owner, mode, xattrs and times on an entry that has no fd
// (symlink, device, fifo, socket), by name and without following it.
func (a *applier) leafMeta(upFd int, name string, tgtFd int, tmp, rel string, st *unix.Stat_t, xattrs []string, chmod bool) error {
	if err := unix.Fchownat(tgtFd, tmp, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fail(rel, "chown", err)
	}
	if chmod {
		// fchmodat2 with AT_SYMLINK_NOFOLLOW: a symlink swapped in for tmp
		// is refused instead of followed.
		if err := unix.Fchmodat(tgtFd, tmp, st.Mode&0o7777, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fail(rel, "chmod", err)
		}
	}
	if err := copyXattrs(upFd, name, tgtFd, tmp, xattrs); err != nil {
		return fail(rel, "set xattr", err)
	}
	ts := statTimes(st)
	if err := unix.UtimesNanoAt(tgtFd, tmp, ts[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fail(rel, "set times", err)
	}
	return nil
}

// hardlink makes name another link to the file already created at first
// (a path relative to the target root, made by this Apply).
func (a *applier) hardlink(tgtFd int, rel, name, first string) error {
	dir, base := path.Split(first)
	srcDir := a.tgtRoot
	if dir != "" {
		fd, err := safeopen.OpenBeneath(a.tgtRoot, strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return fail(rel, "open directory of link target "+first, err)
		}
		defer unix.Close(fd)
		srcDir = fd
	}
	err := a.replace(tgtFd, rel, name, 0, func(tmp string) error {
		// linkat without AT_SYMLINK_FOLLOW links base itself, never what a
		// symlink planted there points to.
		if err := unix.Linkat(srcDir, base, tgtFd, tmp, 0); err != nil {
			if err == unix.EEXIST {
				return err
			}
			return fail(rel, "link to "+first, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	a.stats.Hardlinks++
	return nil
}
