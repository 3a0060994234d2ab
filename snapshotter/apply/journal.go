//go:build linux

package apply

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/safeopen"
)

// A Journal records, while Apply changes a target overlay mount, the
// pre-image in that overlay's upper directory of every path Apply is about
// to change, so that a failed Apply can be undone: Restore puts the upper
// directory back as it was, offline. It is what makes a commit that was
// decided but could not be applied leave its parent as it was.
//
// Pre-images cost little: a record in memory per path changed, and for an
// entry of the upper that Apply replaces or removes one hard link into the
// journal directory (no data is copied; the link keeps the old inode alive
// after the rename or unlink through the mount). A directory of the upper
// that Apply removes has each of its entries linked (files) or recorded
// (directories). The journal is not durable: a crash after a commit's
// decision is handled by completing the commit.
type Journal struct {
	upper  string // the target overlay's upper directory (trusted path)
	dir    string // the journal directory, on upper's filesystem
	prefix string // of this journal's links in dir
	upFd   int    // O_PATH fd of upper; -1 until opened
	jFd    int    // O_PATH fd of dir; -1 until the first link
	seq    int
	recs   map[string]*record
	order  []*record
	temps  []string
	// lastDir/lastFd cache the upper directory last looked into.
	lastDir string
	lastFd  int
}

type recKind int

const (
	recAbsent recKind = iota // nothing at the path in upper
	recLink                  // a non-directory, linked into the journal
	recDir                   // a directory: its metadata
)

type record struct {
	rel   string
	depth int
	kind  recKind
	link  string // name in the journal directory (recLink)
	// recDir: the directory's owner, mode, times and every xattr
	// (overlay's trusted.overlay.* among them).
	st     unix.Stat_t
	xattrs map[string][]byte
	// full: the directory's entries were recorded too (Apply removes it).
	full bool
}

// NewJournal returns a journal of changes to the overlay whose upper
// directory is upper. Its links go into dir, an existing directory on
// upper's filesystem, named prefix and a number: the prefix must be unique
// to the journal. Discard removes them.
func NewJournal(upper, dir, prefix string) *Journal {
	return &Journal{upper: upper, dir: dir, prefix: prefix, upFd: -1, jFd: -1, lastFd: -1, recs: map[string]*record{}}
}

// WithJournal makes Apply record in j the pre-image of each path before
// changing it.
func WithJournal(j *Journal) Opt { return func(o *options) { o.journal = j } }

// Changed reports whether anything was recorded.
func (j *Journal) Changed() bool { return j != nil && (len(j.order) > 0 || len(j.temps) > 0) }

func (j *Journal) open() error {
	if j.upFd >= 0 {
		return nil
	}
	fd, err := unix.Open(j.upper, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("journal: open upper %s: %w", j.upper, err)
	}
	j.upFd = fd
	return nil
}

// upperDir returns an O_PATH fd of directory rel of upper (cached until the
// next call), or -1 if upper has no directory there.
func (j *Journal) upperDir(rel string) (int, error) {
	if rel == "" {
		rel = "."
	}
	if j.lastFd >= 0 && j.lastDir == rel {
		return j.lastFd, nil
	}
	if j.lastFd >= 0 {
		unix.Close(j.lastFd)
		j.lastFd = -1
	}
	if err := j.open(); err != nil {
		return -1, err
	}
	fd, err := safeopen.OpenBeneath(j.upFd, rel, unix.O_PATH|unix.O_DIRECTORY)
	if err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP {
		return -1, nil
	}
	if err != nil {
		return -1, err
	}
	j.lastDir, j.lastFd = rel, fd
	return fd, nil
}

func splitRel(rel string) (dir, base string) {
	if rel == "" {
		return "", "."
	}
	d, b := path.Split(rel)
	return strings.TrimSuffix(d, "/"), b
}

// note records rel's pre-image in upper, unless rel (or a directory above
// it that Apply removes) already has one. Called before Apply first
// changes rel through the mount.
func (j *Journal) note(rel string) error {
	_, err := j.noteAt(rel)
	return err
}

func (j *Journal) noteAt(rel string) (*record, error) {
	if r, ok := j.recs[rel]; ok {
		return r, nil
	}
	dir, base := splitRel(rel)
	depth := 0
	if rel != "" {
		depth = strings.Count(rel, "/") + 1
		// No directory in upper above before Apply: what is below now is
		// Apply's own, and goes with it. No syscall needed.
		if p, ok := j.recs[dir]; ok && p.kind != recDir {
			return j.add(&record{rel: rel, depth: depth, kind: recAbsent}), nil
		}
	}
	fd, err := j.upperDir(dir)
	if err != nil {
		return nil, err
	}
	if fd < 0 {
		return j.add(&record{rel: rel, depth: depth, kind: recAbsent}), nil
	}
	return j.recordEntry(fd, base, rel, depth)
}

func (j *Journal) add(r *record) *record {
	j.recs[r.rel] = r
	j.order = append(j.order, r)
	return r
}

// recordEntry records what upper's directory fd holds as name.
func (j *Journal) recordEntry(fd int, name, rel string, depth int) (*record, error) {
	st, err := lstatAt(fd, name)
	if err == unix.ENOENT {
		return j.add(&record{rel: rel, depth: depth, kind: recAbsent}), nil
	}
	if err != nil {
		return nil, fmt.Errorf("journal: stat %s in upper: %w", shorten(rel), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		link, err := j.linkIn(fd, name)
		if err != nil {
			return nil, fmt.Errorf("journal: keep %s of upper: %w", shorten(rel), err)
		}
		return j.add(&record{rel: rel, depth: depth, kind: recLink, link: link}), nil
	}
	x, err := allXattrs(fd, name)
	if err != nil {
		return nil, fmt.Errorf("journal: read xattrs of %s in upper: %w", shorten(rel), err)
	}
	return j.add(&record{rel: rel, depth: depth, kind: recDir, st: st, xattrs: x}), nil
}

// linkIn hard-links fd/name into the journal directory.
func (j *Journal) linkIn(fd int, name string) (string, error) {
	if j.jFd < 0 {
		jfd, err := unix.Open(j.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		j.jFd = jfd
	}
	j.seq++
	link := j.prefix + strconv.Itoa(j.seq)
	// Without AT_SYMLINK_FOLLOW: a symlink is linked itself.
	if err := unix.Linkat(fd, name, j.jFd, link, 0); err != nil {
		return "", err
	}
	return link, nil
}

// noteRemoval records rel and, if upper holds a directory there, every
// entry below it that has no record yet: Apply is about to remove it all.
func (j *Journal) noteRemoval(rel string) error {
	r, err := j.noteAt(rel)
	if err != nil || r.kind != recDir || r.full {
		return err
	}
	return j.recordBelow(r)
}

func (j *Journal) recordBelow(r *record) error {
	r.full = true
	if err := j.open(); err != nil {
		return err
	}
	fd, err := openDir(j.upFd, dotIfEmpty(r.rel))
	if err != nil {
		return fmt.Errorf("journal: open %s in upper: %w", shorten(r.rel), err)
	}
	names, err := readNames(fd)
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("journal: read %s in upper: %w", shorten(r.rel), err)
	}
	var dirs []*record
	for _, name := range names {
		rel := join(r.rel, name)
		c, ok := j.recs[rel]
		if !ok {
			if c, err = j.recordEntry(fd, name, rel, r.depth+1); err != nil {
				unix.Close(fd)
				return err
			}
		}
		if c.kind == recDir && !c.full {
			dirs = append(dirs, c)
		}
	}
	unix.Close(fd)
	for _, c := range dirs {
		if err := j.recordBelow(c); err != nil {
			return err
		}
	}
	return nil
}

func dotIfEmpty(rel string) string {
	if rel == "" {
		return "."
	}
	return rel
}

// noteTemp records a temporary name Apply created in target.
func (j *Journal) noteTemp(rel string) { j.temps = append(j.temps, rel) }

// Restore puts upper back as the journal found it: first everything Apply
// made at a recorded path is removed (which frees the space it took), then
// the pre-images are put back, parents before children, and last the
// directories' times. Upper is changed offline, through directory fds and
// never following a symlink: the caller must make the overlay mounted over
// it forget what it cached (see DropCaches) or unmount it.
func (j *Journal) Restore(ctx context.Context) error {
	if !j.Changed() {
		return nil
	}
	if err := j.open(); err != nil {
		return err
	}
	byDepth := append([]*record(nil), j.order...)
	sort.SliceStable(byDepth, func(a, b int) bool { return byDepth[a].depth < byDepth[b].depth })
	var errs []error
	// 1. Remove what is there now, deepest first.
	for _, rel := range j.temps {
		if err := j.clear(rel, false); err != nil {
			errs = append(errs, err)
		}
	}
	for i := len(byDepth) - 1; i >= 0; i-- {
		r := byDepth[i]
		if err := j.clear(r.rel, r.kind == recDir); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("journal: restore %s: %w", j.upper, errors.Join(errs...))
	}
	// 2. Put back links and directories, parents first.
	for _, r := range byDepth {
		if err := j.putBack(r); err != nil {
			return fmt.Errorf("journal: restore %s in %s: %w", shorten(r.rel), j.upper, err)
		}
	}
	// 3. Directory times last, children first: every change above moved them.
	for i := len(byDepth) - 1; i >= 0; i-- {
		r := byDepth[i]
		if r.kind != recDir {
			continue
		}
		if err := j.setTimes(r); err != nil {
			return fmt.Errorf("journal: restore times of %s in %s: %w", shorten(r.rel), j.upper, err)
		}
	}
	return nil
}

// clear removes rel from upper, recursively; keepDir keeps a directory.
func (j *Journal) clear(rel string, keepDir bool) error {
	dir, base := splitRel(rel)
	if rel == "" {
		return nil // the root is never removed, only its metadata put back
	}
	fd, err := safeopen.OpenBeneath(j.upFd, dotIfEmpty(dir), unix.O_RDONLY|unix.O_DIRECTORY)
	if err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP {
		// No directory there now: nothing below it to remove (what is
		// there instead is cleared with the parent's own record).
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", shorten(dotIfEmpty(dir)), err)
	}
	defer unix.Close(fd)
	st, err := lstatAt(fd, base)
	if err == unix.ENOENT {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat %s: %w", shorten(rel), err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if keepDir {
			return nil
		}
		return removeTree(fd, base, rel)
	}
	if err := unix.Unlinkat(fd, base, 0); err != nil && err != unix.ENOENT {
		return fmt.Errorf("remove %s: %w", shorten(rel), err)
	}
	return nil
}

// removeTree removes name under dirfd and everything below it, never
// following a symlink.
func removeTree(dirfd int, name, rel string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return fmt.Errorf("remove %s: %w", shorten(rel), err)
	}
	fd, err := openDir(dirfd, name)
	if err != nil {
		return fmt.Errorf("open %s: %w", shorten(rel), err)
	}
	names, err := readNames(fd)
	if err == nil {
		for _, n := range names {
			if err = removeTree(fd, n, join(rel, n)); err != nil {
				break
			}
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
		return fmt.Errorf("remove directory %s: %w", shorten(rel), err)
	}
	return nil
}

func (j *Journal) putBack(r *record) error {
	if r.kind == recAbsent {
		return nil
	}
	dir, base := splitRel(r.rel)
	pfd, err := safeopen.OpenBeneath(j.upFd, dotIfEmpty(dir), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("open parent: %w", err)
	}
	defer unix.Close(pfd)
	if r.kind == recLink {
		return unix.Linkat(j.jFd, r.link, pfd, base, 0)
	}
	if r.rel != "" {
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && err != unix.EEXIST {
			return fmt.Errorf("mkdir: %w", err)
		}
	}
	fd, err := safeopen.OpenBeneath(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer unix.Close(fd)
	have, err := listxattrAt(fd, "")
	if err != nil {
		return fmt.Errorf("list xattrs: %w", err)
	}
	for _, x := range have {
		if _, keep := r.xattrs[x]; !keep {
			if err := removexattrAt(fd, "", x); err != nil && err != unix.ENODATA {
				return fmt.Errorf("remove xattr %s: %w", x, err)
			}
		}
	}
	if err := unix.Fchown(fd, int(r.st.Uid), int(r.st.Gid)); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, r.st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	for x, v := range r.xattrs {
		if err := setxattrAt(fd, "", x, v); err != nil {
			return fmt.Errorf("set xattr %s: %w", x, err)
		}
	}
	return nil
}

func (j *Journal) setTimes(r *record) error {
	fd, err := safeopen.OpenBeneath(j.upFd, dotIfEmpty(r.rel), unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ts := statTimes(&r.st)
	return futimens(fd, &ts)
}

// Discard removes the journal's links (the last links of the entries
// Apply replaced or removed, whose space this frees), once the apply
// succeeded or was restored, and closes the journal.
func (j *Journal) Discard() error {
	defer j.Close()
	if j.jFd < 0 {
		return nil
	}
	var errs []error
	for _, r := range j.order {
		if r.kind == recLink {
			if err := unix.Unlinkat(j.jFd, r.link, 0); err != nil && err != unix.ENOENT {
				errs = append(errs, fmt.Errorf("%s: %w", r.link, err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("journal: remove links in %s: %w", j.dir, errors.Join(errs...))
	}
	return nil
}

// Close releases the journal's descriptors and removes nothing.
func (j *Journal) Close() {
	for _, fd := range []*int{&j.upFd, &j.jFd, &j.lastFd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// allXattrs reads every xattr of dirfd/name (name "" for dirfd itself).
func allXattrs(dirfd int, name string) (map[string][]byte, error) {
	names, err := listxattrAt(dirfd, name)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	out := make(map[string][]byte, len(names))
	for _, x := range names {
		v, err := getxattrAt(dirfd, name, x)
		if err == unix.ENODATA {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", x, err)
		}
		out[x] = v
	}
	return out, nil
}

// readNames reads every entry name of the directory fd.
func readNames(fd int) ([]string, error) {
	buf := make([]byte, 8192)
	var names []string
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}
