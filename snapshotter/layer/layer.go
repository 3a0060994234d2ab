//go:build linux

// Package layer finds what changed in an overlay upper directory since a
// recorded listing of it (a Manifest) and writes those changes out as an
// overlay layer: the engine behind checkpoints and rollback.
//
// The upper is written by untrusted processes while it is read, so every
// entry of it is reached from an open directory fd, one name at a time, with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS); nothing in it is followed.
// The layers this package writes are the snapshotter's own directories.
package layer

import (
	"context"
	"encoding/gob"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Entry is what a manifest records of one path of an upper: enough to tell
// that it is the same inode, unchanged.
type Entry struct {
	Mode  uint32 // type bits only
	Ino   uint64
	Ctime int64 // ns; 0 means "treat as changed next time"
}

// Manifest maps relative paths ("a/b") of an upper to their entries. The
// root is not listed.
type Manifest map[string]Entry

// Kind is how a path changed.
type Kind int

const (
	// Modified: the same inode as recorded, with a newer ctime.
	Modified Kind = iota
	// Added: a path not recorded, or recorded as another inode or type; a
	// directory counts with its whole subtree.
	Added
	// Deleted: recorded, gone from the upper.
	Deleted
)

func (k Kind) String() string {
	return [...]string{"modified", "added", "deleted"}[k]
}

// Change is one changed path. Paths below an Added directory, or below a
// Deleted path, are not listed separately.
type Change struct {
	Path string
	Kind Kind
	// Opaque: an Added directory replaced something the old listing had
	// (or is opaque in the upper), so it must hide what lies below it.
	Opaque bool
}

// recentMargin: a ctime this close to a scan may have been taken from the
// kernel's coarse clock tick that a later write in the same tick would reuse,
// so such entries are recorded as changed and copied again next time. Two
// ticks of the coarse clock the kernel stamps ctimes with.
func recentMargin() time.Duration {
	var res unix.Timespec
	if err := unix.ClockGetres(unix.CLOCK_REALTIME_COARSE, &res); err != nil || res.Nano() <= 0 {
		return 50 * time.Millisecond
	}
	return 2 * time.Duration(res.Nano())
}

// maxDepth bounds how deep a walk goes, so a crafted tree cannot exhaust
// file descriptors.
const maxDepth = 4096

// Diff walks upper and returns what changed since prev, in walk order
// (parents before children), and the listing of upper now.
func Diff(ctx context.Context, upper string, prev Manifest) ([]Change, Manifest, error) {
	fd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open upper %s: %w", upper, err)
	}
	defer unix.Close(fd)
	d := &differ{ctx: ctx, prev: prev, cur: Manifest{}, same: map[string]bool{"": true},
		recent: time.Now().Add(-recentMargin()).UnixNano(), mapped: mappedUnseen(fd, upper)}
	defer d.mapped.close()
	// The upper is read in parallel, then compared in walk order.
	sc := newScanner(ctx, prev).scan(fd, "", 0)
	if err := d.walk(sc, "", false); err != nil {
		return nil, nil, err
	}
	var gone []string
	for p := range prev {
		if _, ok := d.cur[p]; !ok && d.same[parent(p)] {
			gone = append(gone, p)
		}
	}
	sort.Strings(gone)
	for _, p := range gone {
		d.changes = append(d.changes, Change{Path: p, Kind: Deleted})
	}
	return d.changes, d.cur, nil
}

type differ struct {
	ctx     context.Context
	prev    Manifest
	cur     Manifest
	same    map[string]bool // directories present before and after, as the same inode
	recent  int64
	mapped  *mappedFiles // files whose writes through a mapping change no ctime
	changes []Change
}

func (d *differ) walk(sc *scanned, rel string, underAdded bool) error {
	if sc.err != nil {
		return sc.err
	}
	for i, name := range sc.names {
		if err := d.ctx.Err(); err != nil {
			return err
		}
		p := join(rel, name)
		st := sc.stats[i]
		if st.err != nil {
			if st.err == unix.ENOENT { // removed while walking: it is gone
				continue
			}
			return fmt.Errorf("stat %s in upper: %w", p, st.err)
		}
		e := Entry{Mode: st.mode & unix.S_IFMT, Ino: st.ino, Ctime: st.ctime}
		mapped := e.Mode == unix.S_IFREG && d.mapped.has(p)
		if e.Ctime >= d.recent || mapped {
			e.Ctime = 0
		}
		d.cur[p] = e
		isDir := e.Mode == unix.S_IFDIR
		added := false
		if !underAdded {
			old, ok := d.prev[p]
			opaque := isDir && !ok && sc.opaque[i]
			switch {
			case !ok && isDir && !opaque:
				// A new directory merged with whatever lies below it
				// (copied up to hold a change): only its own entries
				// changed, each listed on its own, so a rollback rewrites
				// them rather than the whole directory.
				d.changes = append(d.changes, Change{Path: p, Kind: Modified})
			case !ok || old.Mode != e.Mode || old.Ino != e.Ino:
				added = true
				d.changes = append(d.changes, Change{Path: p, Kind: Added, Opaque: isDir && (ok || opaque)})
			case old.Ctime == 0 || old.Ctime != st.ctime || mapped:
				d.changes = append(d.changes, Change{Path: p, Kind: Modified})
			}
			if isDir && !added {
				d.same[p] = true
			}
		}
		if sub := sc.subs[i]; isDir && sub != nil {
			if err := d.walk(sub, p, underAdded || added); err != nil {
				return err
			}
		}
	}
	return nil
}

// readNames calls fn for every name in the directory fd.
func readNames(fd int, fn func(name string) error) error {
	buf := make([]byte, 16384)
	var names []string
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("read directory: %w", err)
		}
		if n <= 0 {
			return nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names[:0])
		for _, name := range names {
			if err := fn(name); err != nil {
				return err
			}
		}
	}
}

// procPath names an entry of an open directory without resolving anything
// but the directory's own fd: for the l*xattr calls.
func procPath(dirfd int, name string) string {
	p := "/proc/self/fd/" + strconv.Itoa(dirfd)
	if name != "" {
		p += "/" + name
	}
	return p
}

const (
	xattrOpaque   = "trusted.overlay.opaque"
	xattrWhiteout = "trusted.overlay.whiteout"
)

func isOpaque(dirfd int, name string) (bool, error) {
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(procPath(dirfd, name), xattrOpaque, buf)
	if err != nil {
		if err == unix.ENODATA || err == unix.EOPNOTSUPP {
			return false, nil
		}
		return false, err
	}
	return string(buf[:n]) == "y", nil
}

func parent(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// SaveManifest writes m to path (through a temporary file renamed into
// place, so a crash leaves the old file or the new one).
func SaveManifest(path string, m Manifest) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("save manifest: %w", err)
	}
	if err := gob.NewEncoder(f).Encode(m); err != nil {
		f.Close()
		return fmt.Errorf("save manifest: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("save manifest: %w", err)
	}
	return os.Rename(tmp, path)
}

// LoadManifest reads a manifest SaveManifest wrote.
func LoadManifest(path string) (Manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load manifest: %w", err)
	}
	defer f.Close()
	m := Manifest{}
	if err := gob.NewDecoder(f).Decode(&m); err != nil {
		return nil, fmt.Errorf("decode manifest %s: %v: %w", path, err, errdefs.ErrDataLoss)
	}
	return m, nil
}
