//go:build linux

// Package fstest has filesystem helpers for tests: it compares two
// directory trees exactly (every attribute a commit must carry over,
// including hard-link structure and the sparse layout of files), and
// mounts small filesystems to fill.
package fstest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Difference is one way two trees differ at Path (relative, "." is the root).
type Difference struct {
	Path string
	What string // "missing", "type", "mode", "owner", "size", "content", ...
	A, B string // the two values, as text
}

func (d Difference) String() string {
	return fmt.Sprintf("%s: %s differs: %s != %s", d.Path, d.What, d.A, d.B)
}

// MaxReported is how many differences Compare puts in its error.
const MaxReported = 20

// Compare walks both trees without following symlinks and returns nil if
// they are equal, or an error listing the first differences. Compared:
// type, permission and setuid/setgid/sticky bits, owner, size (not of
// directories), content hash, symlink target, device number, mtime in ns
// (every entry, root included), user.* and security.* xattrs (overlay's
// user.overlay.* excluded), which paths share an inode, and each regular
// file's data/hole map. Not compared: atime, ctime, inode numbers as such,
// and link counts beyond the link structure inside the tree.
func Compare(a, b string) error {
	diffs, err := Diff(a, b)
	if err != nil {
		return err
	}
	if len(diffs) == 0 {
		return nil
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "trees %s and %s differ (%d differences", a, b, len(diffs))
	if len(diffs) > MaxReported {
		fmt.Fprintf(&sb, ", first %d shown", MaxReported)
		diffs = diffs[:MaxReported]
	}
	sb.WriteString("):")
	for _, d := range diffs {
		sb.WriteString("\n  ")
		sb.WriteString(d.String())
	}
	return errors.New(sb.String())
}

// Diff returns every difference between the trees at a and b, in path order.
func Diff(a, b string) ([]Difference, error) {
	ta, err := Scan(a)
	if err != nil {
		return nil, err
	}
	tb, err := Scan(b)
	if err != nil {
		return nil, err
	}
	return DiffTrees(ta, tb), nil
}

// Entry is what Scan records of one path.
type Entry struct {
	Type   string
	Mode   uint32 // permission bits with setuid, setgid and sticky
	UID    uint32
	GID    uint32
	Size   int64
	Hash   string // sha256 of a regular file's content
	Link   string // symlink target
	Rdev   uint64
	Mtime  int64 // ns since the epoch
	Xattrs map[string]string
	Sparse string // data extents of a regular file, "start-end,..."
	// Leader is the first path (in sorted order) sharing this entry's inode,
	// for non-directories with more than one link; "" otherwise.
	Leader string

	dev, ino, nlink uint64
}

// Tree maps relative paths ("." for the root) to entries.
type Tree map[string]*Entry

// Scan records every entry under root, without following symlinks.
func Scan(root string) (Tree, error) {
	t := Tree{}
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		e, err := scanEntry(p)
		if err != nil {
			return fmt.Errorf("scan %s: %w", p, err)
		}
		t[rel] = e
		return nil
	})
	if err != nil {
		return nil, err
	}
	groups := map[[2]uint64][]string{}
	for p, e := range t {
		if e.Type != "dir" && e.nlink > 1 {
			k := [2]uint64{e.dev, e.ino}
			groups[k] = append(groups[k], p)
		}
	}
	for _, ps := range groups {
		// A lone path is no structure inside the tree: its other links
		// are elsewhere (or, in an overlay's merged view, are names a
		// whiteout hides, which overlay still counts in st_nlink).
		if len(ps) < 2 {
			continue
		}
		sort.Strings(ps)
		for _, p := range ps {
			t[p].Leader = ps[0]
		}
	}
	return t, nil
}

func typeName(m uint32) string {
	switch m & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFCHR:
		return "char"
	case unix.S_IFBLK:
		return "block"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	}
	return fmt.Sprintf("type%#o", m&unix.S_IFMT)
}

func scanEntry(p string) (*Entry, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return nil, err
	}
	e := &Entry{
		Type:  typeName(st.Mode),
		Mode:  st.Mode & 0o7777,
		UID:   st.Uid,
		GID:   st.Gid,
		Mtime: st.Mtim.Nano(),
		dev:   st.Dev,
		ino:   st.Ino,
		nlink: st.Nlink,
	}
	switch e.Type {
	case "file":
		e.Size = st.Size
		if err := hashFile(p, e); err != nil {
			return nil, err
		}
	case "symlink":
		l, err := os.Readlink(p)
		if err != nil {
			return nil, err
		}
		e.Link = l
		e.Size = st.Size
	case "char", "block":
		e.Rdev = st.Rdev
	}
	x, err := xattrs(p)
	if err != nil {
		return nil, fmt.Errorf("xattrs: %w", err)
	}
	e.Xattrs = x
	return e, nil
}

func hashFile(p string, e *Entry) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var segs []string
	for off := int64(0); off < e.Size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		segs = append(segs, fmt.Sprintf("%d-%d", data, hole))
		off = hole
	}
	e.Sparse = strings.Join(segs, ",")
	if onXFS(fd) {
		e.Sparse = "(xfs: not compared)"
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	e.Hash = hex.EncodeToString(h.Sum(nil))
	return nil
}

// xattrs returns the user.* and security.* xattrs of p; overlay's private
// ones (user.overlay.*; trusted.* is not listed at all) are left out.
func xattrs(p string) (map[string]string, error) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil {
		if err == unix.EOPNOTSUPP {
			return nil, nil
		}
		return nil, err
	}
	if sz == 0 {
		return nil, nil
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, name := range strings.Split(string(buf[:sz]), "\x00") {
		if name == "" || strings.HasPrefix(name, "user.overlay.") ||
			!(strings.HasPrefix(name, "user.") || strings.HasPrefix(name, "security.")) {
			continue
		}
		vsz, err := unix.Lgetxattr(p, name, nil)
		if err != nil {
			return nil, err
		}
		v := make([]byte, vsz)
		vsz, err = unix.Lgetxattr(p, name, v)
		if err != nil {
			return nil, err
		}
		out[name] = string(v[:vsz])
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// DiffTrees is Diff of two scans, for checking a tree against an earlier
// scan of itself.
func DiffTrees(a, b Tree) []Difference {
	paths := map[string]bool{}
	for p := range a {
		paths[p] = true
	}
	for p := range b {
		paths[p] = true
	}
	sorted := make([]string, 0, len(paths))
	for p := range paths {
		sorted = append(sorted, p)
	}
	sort.Strings(sorted)
	var out []Difference
	for _, p := range sorted {
		ea, eb := a[p], b[p]
		if ea == nil || eb == nil {
			out = append(out, Difference{Path: p, What: "presence", A: present(ea), B: present(eb)})
			continue
		}
		out = append(out, diffEntry(p, ea, eb)...)
	}
	return out
}

func present(e *Entry) string {
	if e == nil {
		return "missing"
	}
	return e.Type
}

func diffEntry(p string, a, b *Entry) []Difference {
	var out []Difference
	add := func(what string, va, vb any) {
		out = append(out, Difference{Path: p, What: what, A: fmt.Sprint(va), B: fmt.Sprint(vb)})
	}
	if a.Type != b.Type {
		add("type", a.Type, b.Type)
		return out
	}
	if a.Mode != b.Mode {
		add("mode", fmt.Sprintf("%#o", a.Mode), fmt.Sprintf("%#o", b.Mode))
	}
	if a.UID != b.UID || a.GID != b.GID {
		add("owner", fmt.Sprintf("%d:%d", a.UID, a.GID), fmt.Sprintf("%d:%d", b.UID, b.GID))
	}
	if a.Type != "dir" && a.Size != b.Size {
		add("size", a.Size, b.Size)
	}
	if a.Hash != b.Hash {
		add("content", a.Hash, b.Hash)
	}
	if a.Link != b.Link {
		add("symlink target", a.Link, b.Link)
	}
	if a.Rdev != b.Rdev {
		add("rdev", a.Rdev, b.Rdev)
	}
	if a.Mtime != b.Mtime {
		add("mtime", a.Mtime, b.Mtime)
	}
	if xa, xb := fmt.Sprint(a.Xattrs), fmt.Sprint(b.Xattrs); xa != xb {
		add("xattrs", xa, xb)
	}
	if a.Leader != b.Leader {
		add("hard links", "linked to "+quoteOr(a.Leader), "linked to "+quoteOr(b.Leader))
	}
	if a.Sparse != b.Sparse {
		add("sparse layout", a.Sparse, b.Sparse)
	}
	return out
}

func quoteOr(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}

// onXFS tells whether the file fd is on XFS, or on an overlay in a test
// directory on XFS. XFS preallocates past a write and keeps the blocks as
// unwritten extents, which SEEK_DATA takes for holes: the same writes give
// different layouts (the apply tests saw both a copy sparser and one
// denser than its source, the same bytes), so layouts are not compared
// there; the bytes still are.
func onXFS(fd int) bool {
	var fs unix.Statfs_t
	if unix.Fstatfs(fd, &fs) != nil {
		return false
	}
	if fs.Type == unix.OVERLAYFS_SUPER_MAGIC && unix.Statfs(os.TempDir(), &fs) != nil {
		return false
	}
	return fs.Type == unix.XFS_SUPER_MAGIC
}
