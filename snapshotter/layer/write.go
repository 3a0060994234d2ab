//go:build linux

package layer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/fscopy"
	"github.com/branchbox/branchbox/internal/safeopen"
)

// Stats counts what a Write copied.
type Stats struct {
	Entries int64
	Bytes   int64
}

// Source says, for each changed path, what the new layer must hold there.
type Source struct {
	// Root is the directory the entries are copied from: the upper itself
	// for a checkpoint, a merged view of the old state for a rollback.
	Root string
	// Merged: Root is a merged (overlay) view, so an absent path means a
	// deleted one and must become a whiteout, and a directory replaced
	// wholesale is marked opaque so it hides what lies below it.
	Merged bool
}

// Write makes dst (a new, empty directory) an overlay layer holding, for
// each change, the entry src has at that path now, with every ancestor
// directory carrying src's attributes:
//   - Deleted (or absent in a merged src): a whiteout;
//   - Modified directory: the directory itself, not opaque, without its
//     children (they are listed on their own if they changed);
//   - anything else: the entry with its whole subtree, opaque if the change
//     says so.
func Write(ctx context.Context, src Source, changes []Change, dst string) (Stats, error) {
	sfd, err := unix.Open(src.Root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("open %s: %w", src.Root, err)
	}
	defer unix.Close(sfd)
	w := &writer{ctx: ctx, src: sfd, dst: dst, links: map[[2]uint64]string{}, made: map[string]bool{"": true}, whole: map[string]bool{}, protect: !src.Merged}
	// The root's own attributes: a merged view shows the top layer's.
	var rst unix.Stat_t
	if err := unix.Fstat(sfd, &rst); err != nil {
		return Stats{}, err
	}
	if err := w.meta(sfd, "", dst, &rst, false); err != nil {
		return Stats{}, err
	}
	w.dirs = append(w.dirs, dirTimes{dst, rst})
	for _, c := range changes {
		if err := ctx.Err(); err != nil {
			return w.stats, err
		}
		if err := w.change(c, src.Merged); err != nil {
			return w.stats, err
		}
	}
	// Directory times last: creating their children moved them.
	for i := len(w.dirs) - 1; i >= 0; i-- {
		d := w.dirs[i]
		if err := setTimes(d.path, &d.st); err != nil {
			return w.stats, err
		}
	}
	return w.stats, nil
}

type dirTimes struct {
	path string
	st   unix.Stat_t
}

type writer struct {
	ctx   context.Context
	src   int
	dst   string
	links map[[2]uint64]string
	made  map[string]bool
	whole map[string]bool // paths written with everything below them
	dirs  []dirTimes
	stats Stats
	// copier copies file data, in the kernel where it can (a checkpoint
	// reads the upper, a rollback an overlay mount of the checkpoint).
	copier fscopy.Copier
	// protect: the source is a live upper, whose files its processes may
	// write through shared mappings (protectMapped).
	protect bool
}

func (w *writer) change(c Change, merged bool) error {
	dir := parent(c.Path)
	name := c.Path[len(dir):]
	name = strings.TrimPrefix(name, "/")
	// Below a path already written whole (or as a whiteout): covered.
	for a := dir; a != ""; a = parent(a) {
		if w.whole[a] {
			return nil
		}
	}
	w.whole[c.Path] = true
	if err := w.ensureDir(dir); err != nil {
		return err
	}
	out := filepath.Join(w.dst, c.Path)
	if c.Kind == Deleted && !merged {
		return whiteout(out)
	}
	pfd := w.src
	if dir != "" {
		fd, err := safeopen.OpenBeneath(w.src, dir, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			if merged && (err == unix.ENOENT || err == unix.ENOTDIR) {
				return whiteout(out)
			}
			return fmt.Errorf("open %s: %w", dir, err)
		}
		defer unix.Close(fd)
		pfd = fd
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			// Gone since it was seen changing (or, merged, absent in
			// the old state): a whiteout says so either way.
			return whiteout(out)
		}
		return fmt.Errorf("stat %s: %w", c.Path, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if c.Kind == Modified {
			delete(w.whole, c.Path)
			if w.made[c.Path] {
				return nil
			}
			w.made[c.Path] = true
			return w.mkdir(pfd, name, out, &st, false)
		}
		w.made[c.Path] = true
		// From a merged view, a directory that is not the same one as
		// before replaces whatever is there: opaque.
		return w.tree(pfd, name, out, &st, c.Opaque || merged, 0)
	}
	return w.entry(pfd, name, c.Path, out, &st)
}

// ensureDir makes rel and its ancestors in dst with src's attributes.
func (w *writer) ensureDir(rel string) error {
	if w.made[rel] {
		return nil
	}
	if err := w.ensureDir(parent(rel)); err != nil {
		return err
	}
	fd, err := safeopen.OpenBeneath(w.src, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", rel, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if err := w.mkdir(fd, "", filepath.Join(w.dst, rel), &st, false); err != nil {
		return err
	}
	w.made[rel] = true
	return nil
}

func (w *writer) mkdir(dirfd int, name, out string, st *unix.Stat_t, opaque bool) error {
	if err := os.Mkdir(out, 0o700); err != nil {
		return fmt.Errorf("make layer directory: %w", err)
	}
	w.stats.Entries++
	if err := w.meta(dirfd, name, out, st, opaque); err != nil {
		return err
	}
	w.dirs = append(w.dirs, dirTimes{out, *st})
	return nil
}

// tree copies the directory name of dirfd and everything below it.
func (w *writer) tree(dirfd int, name, out string, st *unix.Stat_t, opaque bool, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%s is deeper than %d levels: %w", out, maxDepth, errdefs.ErrInvalidArgument)
	}
	if err := w.mkdir(dirfd, name, out, st, opaque); err != nil {
		return err
	}
	fd, err := safeopen.OpenBeneath(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("open %s: %w", out, err)
	}
	defer unix.Close(fd)
	return readNames(fd, func(n string) error {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		var cst unix.Stat_t
		if err := unix.Fstatat(fd, n, &cst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if err == unix.ENOENT {
				return nil
			}
			return err
		}
		o := filepath.Join(out, n)
		if cst.Mode&unix.S_IFMT == unix.S_IFDIR {
			cop, err := isOpaque(fd, n)
			if err != nil {
				return err
			}
			return w.tree(fd, n, o, &cst, cop, depth+1)
		}
		return w.entry(fd, n, o, o, &cst)
	})
}

// entry copies one non-directory.
func (w *writer) entry(dirfd int, name, rel, out string, st *unix.Stat_t) error {
	key := [2]uint64{st.Dev, st.Ino}
	if st.Nlink > 1 {
		if first, ok := w.links[key]; ok {
			if err := os.Link(first, out); err != nil {
				return fmt.Errorf("link %s: %w", rel, err)
			}
			return nil
		}
	}
	w.stats.Entries++
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := w.file(dirfd, name, rel, out, st); err != nil {
			return err
		}
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return fmt.Errorf("read link %s: %w", rel, err)
		}
		if err := unix.Symlink(string(buf[:n]), out); err != nil {
			return fmt.Errorf("make link %s: %w", rel, err)
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		if err := unix.Mknod(out, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("make node %s: %w", rel, err)
		}
	default:
		return fmt.Errorf("%s has unknown file type %#o: %w", rel, st.Mode&unix.S_IFMT, errdefs.ErrInvalidArgument)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		if err := w.meta(dirfd, name, out, st, false); err != nil {
			return err
		}
		if err := setTimes(out, st); err != nil {
			return err
		}
	}
	if st.Nlink > 1 {
		w.links[key] = out
	}
	return nil
}

func (w *writer) file(dirfd int, name, rel, out string, st *unix.Stat_t) error {
	// O_NONBLOCK: an entry that became a fifo since the stat must not hang
	// the open; the fstat below catches it.
	in, err := safeopen.OpenBeneath(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return fmt.Errorf("open %s: %w", rel, err)
	}
	defer unix.Close(in)
	var now unix.Stat_t
	if err := unix.Fstat(in, &now); err != nil {
		return err
	}
	if now.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s changed type while being copied: %w", rel, errdefs.ErrAborted)
	}
	if w.protect {
		if err := protectMapped(in); err != nil {
			return fmt.Errorf("write back %s before copying it: %w", rel, err)
		}
	}
	o, err := unix.Open(out, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", out, err)
	}
	defer unix.Close(o)
	n, _, err := w.copier.Data(in, o, now.Size)
	w.stats.Bytes += n
	if err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	if err := unix.Ftruncate(o, now.Size); err != nil {
		return err
	}
	if err := w.meta(dirfd, name, out, &now, false); err != nil {
		return err
	}
	return setTimes(out, &now)
}

// protectMapped writes back the dirty pages of an upper's file before a
// checkpoint copies it. A write through a shared mapping to a page that is
// dirty already changes neither the file's ctime nor anything else a diff
// could see; the kernel updates the ctime at the first write to a page
// after it was written back, because writeback makes the page read-only in
// every mapping. A file written through a mapping since the last
// checkpoint changed its ctime at that first write, so it is among the
// changes copied now; written back here, before its copy, each later
// write to it through a mapping changes its ctime again, and the next
// checkpoint or a rollback sees it (TestCheckpointSeesMappedWrites). The
// writeback is started, not waited for: the pages are made read-only when
// it starts. WAIT_BEFORE: a page already being written back when it was
// dirtied again is waited for, since starting writeback skips it.
func protectMapped(fd int) error {
	return unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE)
}

// meta gives out the owner, mode and xattrs of src entry name of dirfd
// ("" for dirfd itself). Of overlay's private xattrs only the opaque and
// whiteout marks mean anything in a layer; opaque is set only if asked.
func (w *writer) meta(dirfd int, name, out string, st *unix.Stat_t, opaque bool) error {
	if err := unix.Lchown(out, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", out, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(out, st.Mode&0o7777); err != nil {
			return fmt.Errorf("chmod %s: %w", out, err)
		}
	}
	src := procPath(dirfd, name)
	list, err := llistxattr(src)
	if err != nil {
		return fmt.Errorf("list xattrs of %s: %w", out, err)
	}
	for _, x := range list {
		if !(strings.HasPrefix(x, "user.") || strings.HasPrefix(x, "security.") || x == xattrWhiteout) || strings.HasPrefix(x, "user.overlay.") {
			continue
		}
		v, err := lgetxattr(src, x)
		if err == unix.ENODATA {
			continue
		}
		if err != nil {
			return fmt.Errorf("read xattr %s of %s: %w", x, out, err)
		}
		if err := unix.Lsetxattr(out, x, v, 0); err != nil {
			return fmt.Errorf("set xattr %s on %s: %w", x, out, err)
		}
	}
	if opaque {
		if err := unix.Lsetxattr(out, xattrOpaque, []byte("y"), 0); err != nil {
			return fmt.Errorf("mark %s opaque: %w", out, err)
		}
	}
	return nil
}

func whiteout(path string) error {
	if err := unix.Mknod(path, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("make whiteout %s: %w", path, err)
	}
	return nil
}

func setTimes(path string, st *unix.Stat_t) error {
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", path, err)
	}
	return nil
}

func llistxattr(path string) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Llistxattr(path, buf)
		if err == unix.ERANGE && len(buf) < 1<<20 {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err == unix.EOPNOTSUPP {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		var out []string
		for _, b := range strings.Split(string(buf[:n]), "\x00") {
			if b != "" {
				out = append(out, b)
			}
		}
		return out, nil
	}
}

func lgetxattr(path, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(path, name, buf)
		if err == unix.ERANGE && len(buf) < 1<<20 {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}
