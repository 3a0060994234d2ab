//go:build linux

package apply

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/safeopen"
)

// Needs is what applying an upper layer will take from the target's
// filesystem, at most: Bytes of data blocks (each file's allocated blocks,
// each directory one block) and Inodes.
type Needs struct {
	Bytes, Inodes int64
	// Entries is how many entries upper holds; Depth its deepest level.
	Entries int64
	Depth   int
}

// Measure walks upper (a branch's overlay upper, untrusted) and checks
// everything about it that would make Apply fail, before anything is
// changed: entries Apply does not implement (redirect and metacopy
// xattrs), a tree deeper than Apply walks (WithMaxDepth), and, in the
// target's layers (targetLayers: its upper, then its lowers, all read
// only), a directory that a whiteout, an opaque directory or a
// non-directory in upper would make Apply remove and that is deeper than
// Apply removes. A layer's subtree is measured alone, so the depth of the
// merged view is overestimated at worst. It returns what Apply will need.
func Measure(ctx context.Context, upper string, targetLayers []string, opts ...Opt) (Needs, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxDepth <= 0 {
		o.maxDepth = DefaultMaxDepth
	}
	m := &measurer{ctx: ctx, max: o.maxDepth}
	upFd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Needs{}, fmt.Errorf("measure: open upper %s: %w: %w", upper, kind(err), err)
	}
	defer unix.Close(upFd)
	// Opened on first need: most commits remove nothing.
	seen := map[string]bool{}
	for _, l := range targetLayers {
		if !seen[l] {
			seen[l] = true
			m.layerPaths = append(m.layerPaths, l)
		}
	}
	m.layers = make([]int, len(m.layerPaths))
	for i := range m.layers {
		m.layers[i] = -1
	}
	defer func() {
		for _, fd := range m.layers {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	if err := m.dir(upFd, "", 0); err != nil {
		return m.needs, err
	}
	return m.needs, nil
}

type measurer struct {
	ctx        context.Context
	max        int
	layerPaths []string
	layers     []int // fds of layerPaths, -1 until opened
	seen       map[devIno]bool
	needs      Needs
}

func (m *measurer) dir(fd int, rel string, depth int) error {
	if depth >= m.max {
		return invalid(rel, "upper is deeper than %d levels, the most a commit applies", m.max)
	}
	m.needs.Depth = max(m.needs.Depth, depth)
	m.needs.Bytes += 4096
	m.needs.Inodes++
	names, err := readNames(fd)
	if err != nil {
		return fail(rel, "read upper directory", err)
	}
	var subdirs []string
	// Each layer's counterpart of this directory, opened on first need.
	tgt := make([]int, len(m.layers))
	for i := range tgt {
		tgt[i] = -2
	}
	defer func() {
		for _, t := range tgt {
			if t >= 0 {
				unix.Close(t)
			}
		}
	}()
	for _, name := range names {
		if err := m.ctx.Err(); err != nil {
			return fmt.Errorf("measure %s: %w", join(rel, name), err)
		}
		isDir, err := m.entry(fd, tgt, rel, name, depth)
		if err != nil {
			return err
		}
		if isDir {
			subdirs = append(subdirs, name)
		}
	}
	for i, t := range tgt {
		if t >= 0 {
			unix.Close(t)
		}
		tgt[i] = -2
	}
	for _, name := range subdirs {
		sub, err := openDir(fd, name)
		if err != nil {
			return fail(join(rel, name), "open upper directory", err)
		}
		err = m.dir(sub, join(rel, name), depth+1)
		unix.Close(sub)
		if err != nil {
			return err
		}
	}
	return nil
}

// entry measures the entry name of the upper directory fd (at rel, depth
// deep), whose counterparts in the target layers tgt opens on first need,
// and says whether it is a directory to descend into.
func (m *measurer) entry(fd int, tgt []int, rel, name string, depth int) (bool, error) {
	erel := join(rel, name)
	if !validName(name) {
		return false, invalid(erel, "bad name %q in upper", name)
	}
	m.needs.Entries++
	st, err := lstatAt(fd, name)
	if err != nil {
		return false, fail(erel, "stat upper", err)
	}
	private, _, err := upperXattrs(fd, name)
	if err != nil {
		return false, fail(erel, "list upper xattrs", err)
	}
	if private[xattrRedirect] {
		return false, fmt.Errorf("apply %s: redirect xattr (redirect_dir) in upper: %w", erel, errdefs.ErrNotImplemented)
	}
	if private[xattrMetacopy] {
		return false, fmt.Errorf("apply %s: metacopy xattr in upper: %w", erel, errdefs.ErrNotImplemented)
	}
	typ := st.Mode & unix.S_IFMT
	removes := typ != unix.S_IFDIR
	if typ == unix.S_IFDIR {
		if private[xattrOpaque] {
			v, err := getxattrAt(fd, name, xattrOpaque)
			if err != nil && err != unix.ENODATA {
				return false, fail(erel, "read opaque xattr", err)
			}
			removes = string(v) == "y"
		}
	} else if k := (devIno{uint64(st.Dev), st.Ino}); st.Nlink <= 1 || !m.seen[k] {
		if st.Nlink > 1 {
			if m.seen == nil {
				m.seen = map[devIno]bool{}
			}
			m.seen[k] = true
		}
		m.needs.Bytes += st.Blocks * 512
		m.needs.Inodes++
	}
	if removes {
		if err := m.checkRemoval(tgt, rel, name, depth+1); err != nil {
			return false, err
		}
	}
	return typ == unix.S_IFDIR, nil
}

// checkRemoval measures, in each target layer, the directory rel/name that
// Apply would remove (at level depth): it must not be deeper than Apply
// removes.
func (m *measurer) checkRemoval(tgt []int, rel, name string, depth int) error {
	for i := range m.layers {
		if tgt[i] == -2 {
			tgt[i] = -1
			if m.layers[i] < 0 {
				fd, err := unix.Open(m.layerPaths[i], unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					return fmt.Errorf("measure: open target layer %s: %w: %w", m.layerPaths[i], kind(err), err)
				}
				m.layers[i] = fd
			}
			if fd, err := safeopen.OpenBeneath(m.layers[i], dotIfEmpty(rel), unix.O_PATH|unix.O_DIRECTORY); err == nil {
				tgt[i] = fd
			}
		}
		if tgt[i] < 0 {
			continue
		}
		st, err := lstatAt(tgt[i], name)
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		sub, err := openDir(tgt[i], name)
		if err != nil {
			return fail(join(rel, name), "open target directory", err)
		}
		err = m.removalDepth(sub, join(rel, name), depth)
		unix.Close(sub)
		if err != nil {
			return err
		}
	}
	return nil
}

func (m *measurer) removalDepth(fd int, rel string, depth int) error {
	if depth >= m.max {
		return invalid(rel, "the parent's directory this commit removes is deeper than %d levels, the most a commit removes", m.max)
	}
	names, err := readNames(fd)
	if err != nil {
		return fail(rel, "read target directory", err)
	}
	for _, name := range names {
		st, err := lstatAt(fd, name)
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		sub, err := openDir(fd, name)
		if err != nil {
			return fail(join(rel, name), "open target directory", err)
		}
		err = m.removalDepth(sub, join(rel, name), depth+1)
		unix.Close(sub)
		if err != nil {
			return err
		}
	}
	return nil
}
