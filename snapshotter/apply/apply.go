//go:build linux

// Package apply commits an overlayfs upper layer into a directory: after
// Apply, the directory shows what an overlay mount of the upper over its old
// contents would have shown. It is the engine behind commit-to-parent.
//
// Both trees may have been written by untrusted processes, so every file is
// reached from an open directory fd, one name at a time, with openat2's
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS and *at syscalls
// that never follow a final symlink. No path string is ever opened whole.
package apply

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/fscopy"
)

// TempPrefix starts the name of every temporary entry Apply creates in
// target. Entries are renamed over their final names, so a name with this
// prefix left in target can only come from an Apply that was killed; crash
// recovery may remove them.
const TempPrefix = ".branchbox-apply-"

// DefaultMaxDepth bounds how deep a tree Apply walks (and removes), so that a
// crafted tree cannot exhaust file descriptors or memory.
const DefaultMaxDepth = 4096

// Overlay's private xattrs in an upper layer (trusted.* for root mounts).
const (
	xattrOpaque   = "trusted.overlay.opaque"
	xattrWhiteout = "trusted.overlay.whiteout"
	xattrRedirect = "trusted.overlay.redirect"
	xattrMetacopy = "trusted.overlay.metacopy"
)

// Stats counts what Apply did. Whiteouts and Opaques are the entries of
// those kinds found in upper; Devices counts device nodes, fifos and sockets;
// Hardlinks counts links made to a file already created by this Apply; Bytes
// is the file data copied (holes excluded).
type Stats struct {
	Files, Dirs, Symlinks, Hardlinks, Devices, Whiteouts, Opaques int
	Bytes                                                         int64
}

// Opt changes how Apply works.
type Opt func(*options)

type options struct {
	maxDepth   int
	maxEntries int64
	// beforeOpen, for tests, runs between an entry's checks and its open:
	// the window a swapped-in symlink would use.
	beforeOpen func(side, rel string)
	// removeTemps: remove TempPrefix entries a killed Apply left.
	removeTemps bool
	// targetUpper: the upper directory of target's overlay (see
	// WithTargetUpper); "" if not known.
	targetUpper string
	// journal, if set, records pre-images before each change (journal.go).
	journal *Journal
}

// WithStaleTempRemoval makes Apply first remove, from every target
// directory it visits, the TempPrefix entries that an earlier Apply of the
// same upper left when it was killed. Those are the only directories such
// an Apply wrote temporaries in, so running it again with this option
// leaves none. For crash recovery only: a name of the target's own that
// starts with TempPrefix would go too.
func WithStaleTempRemoval() Opt { return func(o *options) { o.removeTemps = true } }

// WithTargetUpper names the upper directory of the overlay mounted at
// target. Apply only looks in it (never writes), to replace an entry that
// is already there by exchanging it with the new one and unlinking the old,
// which the upper filesystem does faster than a rename over it (ext4 starts
// writing the new file's data and evicts the old inode inside the rename).
// An entry only in a lower layer is still replaced by rename: an exchange
// would copy it up first.
func WithTargetUpper(dir string) Opt { return func(o *options) { o.targetUpper = dir } }

// WithMaxDepth sets the deepest directory level Apply accepts in upper and
// removes in target (DefaultMaxDepth if unset or <= 0).
func WithMaxDepth(n int) Opt { return func(o *options) { o.maxDepth = n } }

// WithMaxEntries makes Apply fail once upper holds more than n entries
// (unlimited if 0): a cap on how long one commit may take.
func WithMaxEntries(n int64) Opt { return func(o *options) { o.maxEntries = n } }

type devIno struct{ dev, ino uint64 }

type applier struct {
	ctx     context.Context
	opts    options
	tgtRoot int
	stats   Stats
	entries int64
	// links maps an upper inode with more than one link to the target path
	// (relative to tgtRoot) of the first copy made, so later names link to it.
	links   map[devIno]string
	tmpBase string
	tmpSeq  int
	// copier copies file data, remembering which of the kernel's ways
	// the pair of filesystems (upper's and the mount's) refused.
	copier fscopy.Copier
	// tgtUpper is the fd of target's upper directory (-1 if not known);
	// peekDir/peekFd the last directory of it looked into (peekFd -1 if it
	// does not exist there).
	tgtUpper int
	peekDir  string
	peekFd   int
}

// Apply makes the tree at target (a directory: normally the mount point of
// the parent's live overlay mount, or a temporary mount of it) equal to what
// an overlay mount of upper over target's current contents would show. upper
// is a branch's overlay upper directory, written by untrusted processes.
//
// Target must be a merged view (an overlay mount, or a plain directory that
// is not a lower of anything): whiteouts become unlinks in target, so on an
// overlay mount they become the overlay's own whiteouts. To commit into a
// parent that is not mounted, mount it (temporarily) and pass the mount: a
// raw upper directory as target would lose deletions of lower entries.
//
// Copied: content (holes kept), mode, owner, atime/mtime, user.* and
// security.* xattrs, symlink text, device numbers, hard links among upper's
// entries. Not copied: trusted.* (overlay's private xattrs among them) and
// system.* xattrs (POSIX ACLs), file attributes (chattr flags).
//
// Apply is not atomic as a whole: each entry is replaced atomically (created
// under a TempPrefix name, then renamed), and on error target is left part
// applied. Making a commit atomic is the caller's business: WithJournal
// records what undoing it takes (journal.go).
func Apply(ctx context.Context, upper, target string, opts ...Opt) (Stats, error) {
	a := &applier{ctx: ctx, links: map[devIno]string{}, tgtUpper: -1, peekFd: -1}
	for _, o := range opts {
		o(&a.opts)
	}
	if a.opts.maxDepth <= 0 {
		a.opts.maxDepth = DefaultMaxDepth
	}
	a.tmpBase = TempPrefix + strconv.Itoa(os.Getpid()) + "-"

	// The two roots are the caller's, trusted paths; everything below them
	// is reached through these fds only.
	upFd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("apply: open upper %s: %w: %w", upper, kind(err), err)
	}
	defer unix.Close(upFd)
	a.tgtRoot, err = unix.Open(target, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("apply: open target %s: %w: %w", target, kind(err), err)
	}
	defer unix.Close(a.tgtRoot)
	if a.opts.targetUpper != "" {
		// Only a hint: without it every replacement is a rename.
		if fd, err := unix.Open(a.opts.targetUpper, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			a.tgtUpper = fd
			defer unix.Close(fd)
		}
	}
	defer func() {
		if a.peekFd >= 0 {
			unix.Close(a.peekFd)
		}
	}()

	if err := a.note(""); err != nil {
		return a.stats, err
	}
	if err := a.dir(upFd, a.tgtRoot, "", 0); err != nil {
		return a.stats, err
	}
	// The merged root shows the upper root's own attributes (overlay ignores
	// an opaque mark on the root, so no opaque handling here).
	if err := a.dirMeta(upFd, a.tgtRoot, "."); err != nil {
		return a.stats, err
	}
	log.G(ctx).WithField("stats", fmt.Sprintf("%+v", a.stats)).Debug("apply: done")
	return a.stats, nil
}

// fail wraps a syscall error with the path and step that failed and its
// errdefs kind.
func fail(rel, op string, err error) error {
	rel = shorten(rel)
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("apply %s: %s: %w", rel, op, err)
	}
	return fmt.Errorf("apply %s: %s: %w: %w", rel, op, kind(err), err)
}

func invalid(rel, format string, args ...any) error {
	return fmt.Errorf("apply %s: %s: %w", shorten(rel), fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

// shorten keeps error messages readable for paths thousands of levels deep.
func shorten(rel string) string {
	if rel == "" {
		return "."
	}
	if len(rel) <= 512 {
		return rel
	}
	return fmt.Sprintf("%s/.../%s (%d levels)", rel[:128], rel[len(rel)-128:], strings.Count(rel, "/")+1)
}
