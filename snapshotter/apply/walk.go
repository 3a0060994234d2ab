//go:build linux

package apply

import (
	"fmt"
	"path"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/safeopen"
)

// The walk: Apply goes through the upper one directory at a time, from
// open directory fds on both sides, and hands each entry to the copy or the
// removal that its kind (file, whiteout, opaque or plain directory) asks for.

func join(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "/" + name
}

// validName rejects names no directory entry may have; getdents cannot
// return them, but the check costs nothing and keeps the invariant local.
func validName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\x00")
}

// dir applies every entry of the upper directory upFd to tgtFd. Entries are
// streamed from getdents in batches, so a huge directory costs no memory.
func (a *applier) dir(upFd, tgtFd int, rel string, depth int) error {
	if depth >= a.opts.maxDepth {
		return invalid(rel, "upper is deeper than %d levels", a.opts.maxDepth)
	}
	if a.opts.removeTemps {
		if err := a.removeStaleTemps(tgtFd, rel, depth); err != nil {
			return err
		}
	}
	buf := make([]byte, 8192)
	var names []string
	for {
		n, err := unix.ReadDirent(upFd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fail(rel, "read upper directory", err)
		}
		if n <= 0 {
			return nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names[:0])
		for _, name := range names {
			if err := a.ctx.Err(); err != nil {
				return fmt.Errorf("apply %s: %w", join(rel, name), err)
			}
			a.entries++
			if a.opts.maxEntries > 0 && a.entries > a.opts.maxEntries {
				return fmt.Errorf("apply %s: upper has more than %d entries: %w", join(rel, name), a.opts.maxEntries, errdefs.ErrResourceExhausted)
			}
			if err := a.entry(upFd, tgtFd, rel, name, depth); err != nil {
				return err
			}
		}
	}
}

// upperXattrs lists an upper entry's xattrs and splits them into overlay's
// private ones (by name) and the ones to copy.
func upperXattrs(dirfd int, name string) (private map[string]bool, copyable []string, err error) {
	all, err := listxattrAt(dirfd, name)
	if err != nil {
		return nil, nil, err
	}
	for _, x := range all {
		switch {
		case strings.HasPrefix(x, "trusted.overlay."), strings.HasPrefix(x, "user.overlay."):
			if private == nil {
				private = map[string]bool{}
			}
			private[x] = true
		case strings.HasPrefix(x, "user."), strings.HasPrefix(x, "security."):
			copyable = append(copyable, x)
		}
	}
	return private, copyable, nil
}

func (a *applier) entry(upFd, tgtFd int, parent, name string, depth int) error {
	rel := join(parent, name)
	if !validName(name) {
		return invalid(rel, "bad name %q in upper", name)
	}
	st, err := lstatAt(upFd, name)
	if err != nil {
		return fail(rel, "stat upper", err)
	}
	private, xattrs, err := upperXattrs(upFd, name)
	if err != nil {
		return fail(rel, "list upper xattrs", err)
	}
	// Features this engine does not implement change what the mount shows;
	// refuse rather than commit something else.
	if private[xattrRedirect] {
		return fmt.Errorf("apply %s: redirect xattr (redirect_dir) in upper: %w", rel, errdefs.ErrNotImplemented)
	}
	if private[xattrMetacopy] {
		return fmt.Errorf("apply %s: metacopy xattr in upper: %w", rel, errdefs.ErrNotImplemented)
	}

	typ := st.Mode & unix.S_IFMT
	// A whiteout is a 0/0 char device, or (as the kernel's lookup treats it)
	// an empty regular file carrying overlay.whiteout.
	if (typ == unix.S_IFCHR && st.Rdev == 0) || (typ == unix.S_IFREG && st.Size == 0 && private[xattrWhiteout]) {
		a.stats.Whiteouts++
		if err := a.removeAll(tgtFd, name, rel, depth); err != nil {
			return err
		}
		return nil
	}
	if typ == unix.S_IFDIR {
		opaque := false
		if private[xattrOpaque] {
			v, err := getxattrAt(upFd, name, xattrOpaque)
			if err != nil && err != unix.ENODATA {
				return fail(rel, "read opaque xattr", err)
			}
			// "y" hides the lower directory; "x" only says the directory
			// holds xattr whiteouts, and it stays merged.
			opaque = string(v) == "y"
		}
		return a.subdir(upFd, tgtFd, rel, name, opaque, depth)
	}

	key := devIno{uint64(st.Dev), st.Ino}
	if st.Nlink > 1 {
		if first, ok := a.links[key]; ok {
			return a.hardlink(tgtFd, rel, name, first)
		}
	}
	switch typ {
	case unix.S_IFREG:
		err = a.file(upFd, tgtFd, rel, name, xattrs)
	case unix.S_IFLNK:
		err = a.symlink(upFd, tgtFd, rel, name, &st, xattrs)
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		err = a.special(upFd, tgtFd, rel, name, &st, xattrs)
	default:
		err = invalid(rel, "unknown file type %#o", typ)
	}
	if err != nil {
		return err
	}
	if st.Nlink > 1 {
		a.links[key] = rel
	}
	return nil
}

// subdir merges (or, when opaque or of another type in target, replaces)
// the directory name.
func (a *applier) subdir(upFd, tgtFd int, rel, name string, opaque bool, depth int) error {
	tst, err := lstatAt(tgtFd, name)
	exists := err == nil
	if err != nil && err != unix.ENOENT {
		return fail(rel, "stat target", err)
	}
	if err := a.note(rel); err != nil {
		return err
	}
	// Through an overlay mount, rmdir then mkdir makes the overlay mark the
	// new directory opaque itself, which is what an opaque upper dir means.
	if exists && (opaque || tst.Mode&unix.S_IFMT != unix.S_IFDIR) {
		if err := a.removeAll(tgtFd, name, rel, depth); err != nil {
			return err
		}
		exists = false
	}
	if !exists {
		if err := unix.Mkdirat(tgtFd, name, 0o700); err != nil {
			return fail(rel, "mkdir target", err)
		}
	}
	a.hook("upper", rel)
	subUp, err := openDir(upFd, name)
	if err != nil {
		return fail(rel, "open upper directory", err)
	}
	defer unix.Close(subUp)
	// A symlink swapped in after the checks above makes this fail (ELOOP),
	// never followed.
	a.hook("target", rel)
	subTgt, err := openDir(tgtFd, name)
	if err != nil {
		return fail(rel, "open target directory", err)
	}
	defer unix.Close(subTgt)
	if err := a.dir(subUp, subTgt, rel, depth+1); err != nil {
		return err
	}
	a.stats.Dirs++
	if opaque {
		a.stats.Opaques++
	}
	return a.dirMeta(subUp, subTgt, rel)
}

// dirMeta gives a target directory the upper one's owner, mode, xattrs and
// times; called after its children, whose changes moved its mtime.
func (a *applier) dirMeta(upFd, tgtFd int, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstat(upFd, &st); err != nil {
		return fail(rel, "stat upper directory", err)
	}
	_, want, err := upperXattrs(upFd, "")
	if err != nil {
		return fail(rel, "list upper xattrs", err)
	}
	// A merged directory keeps target's xattrs unless removed: the mount
	// would show only upper's.
	_, have, err := upperXattrs(tgtFd, "")
	if err != nil {
		return fail(rel, "list target xattrs", err)
	}
	for _, x := range have {
		if !contains(want, x) {
			if err := removexattrAt(tgtFd, "", x); err != nil && err != unix.ENODATA {
				return fail(rel, "remove xattr "+x, err)
			}
		}
	}
	if err := unix.Fchown(tgtFd, int(st.Uid), int(st.Gid)); err != nil {
		return fail(rel, "chown", err)
	}
	if err := unix.Fchmod(tgtFd, st.Mode&0o7777); err != nil {
		return fail(rel, "chmod", err)
	}
	if err := copyXattrs(upFd, "", tgtFd, "", want); err != nil {
		return fail(rel, "set xattr", err)
	}
	ts := statTimes(&st)
	if err := futimens(tgtFd, &ts); err != nil {
		return fail(rel, "set times", err)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// inTargetUpper says whether target's upper directory holds rel as a
// non-directory. Only a hint for how to replace rel: never an error.
func (a *applier) inTargetUpper(rel string) bool {
	if a.tgtUpper < 0 {
		return false
	}
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	if j := a.opts.journal; j != nil {
		// The journal has just looked into the same directory.
		fd, err := j.upperDir(dir)
		if err != nil || fd < 0 {
			return false
		}
		return peekUpper(fd, base)
	}
	if dir != a.peekDir || a.peekDir == "" {
		if a.peekFd >= 0 {
			unix.Close(a.peekFd)
		}
		a.peekDir = dir
		a.peekFd = -1
		if fd, err := safeopen.OpenBeneath(a.tgtUpper, dir, unix.O_PATH|unix.O_DIRECTORY); err == nil {
			a.peekFd = fd
		}
	}
	if a.peekFd < 0 {
		return false
	}
	return peekUpper(a.peekFd, base)
}

// peekUpper says whether the upper directory fd holds name as a
// non-directory that is not a whiteout.
func peekUpper(fd int, base string) bool {
	st, err := lstatAt(fd, base)
	if err != nil {
		return false
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return false
	case unix.S_IFCHR:
		return st.Rdev != 0 // 0/0 is a whiteout: the entry is not there
	}
	return true
}
