//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// Branch layers live beside the snapshots they branch from:
//
//	<root>/branches/<root snapshot id>/<branch id>/fs    the branch's upper
//	<root>/branches/<root snapshot id>/<branch id>/work  its overlay workdir
//	<root>/mnt/<root snapshot id>-<branch>              a temporary mount of
//	                                                     a branch being committed into
//
// The branch trees are stored in the branch database (branches.db, see
// branchdb.go), one JSON document per root snapshot, apart from
// containerd's snapshot metadata. Branches are not containerd snapshots:
// containerd's Walk never lists them, so its garbage collector cannot
// remove them; removing the root snapshot removes its whole tree.

// Bucket names in the branch database.
const (
	bucketBranchbox = "branchbox.v1"
	bucketTrees     = "trees" // root snapshot id -> JSON tree of live nodes
	bucketEnded     = "ended" // root snapshot id -> bucket of tombstones
	maxTombstones   = 1024    // per tree; the oldest are dropped first
)

// TreeInfo is a branch tree with the state of every node.
type TreeInfo struct {
	Root  string
	Nodes []branch.Info
	// Quarantine, if not "", says that the tree's recovery failed and why:
	// its branch operations are refused (quarantine.go).
	Quarantine string
}

// CommitResult says what a commit did.
type CommitResult struct {
	Plan   branch.CommitPlan
	Parent branch.Info
}

// Fault points the tests arm to crash the daemon mid-operation.
const (
	FaultForkDirs       = "fork:dirs-created"
	FaultForkCommitted  = "fork:committed"
	FaultCommitDecided  = "commit:decided"
	FaultCommitApplied  = "commit:applied"
	FaultCommitFinished = "commit:finished"
	FaultAbortDecided   = "abort:decided"
	FaultAbortRemoved   = "abort:removed"
)

// WithFaultHook calls hook at each named fault point; tests use it to kill
// the process there.
func WithFaultHook(hook func(point string)) Opt {
	return func(c *config) { c.fault = hook }
}

func (s *store) fault(point string) {
	if s.faultHook != nil {
		s.faultHook(point)
	}
}

// rootSnap is a resolved root snapshot.
type rootSnap struct {
	key   string
	snap  storage.Snapshot
	idmap idMapping // from its labels (idmap_linux.go)
}

func (r rootSnap) id() string { return r.snap.ID }

// resolve finds the root snapshot and the branch a Ref names. It must
// run inside a metadata transaction.
func (s *Branches) resolve(ctx context.Context, c branch.Ref) (rootSnap, string, error) {
	var key, fromUpper string
	switch {
	case c.Root.Key != "" && c.Root.Upperdir != "":
		return rootSnap{}, "", fmt.Errorf("name the root snapshot by key or by upper directory, not both: %w", errdefs.ErrInvalidArgument)
	case c.Root.Key != "":
		if err := validateKey("branch", c.Root.Key); err != nil {
			return rootSnap{}, "", err
		}
		key = c.Root.Key
	case c.Root.Upperdir != "":
		id, b, err := s.parseUpperdir(c.Root.Upperdir)
		if err != nil {
			return rootSnap{}, "", err
		}
		ids, err := storage.IDMap(ctx)
		if err != nil && !errdefs.IsNotFound(err) {
			return rootSnap{}, "", err
		}
		k, ok := ids[id]
		if !ok {
			return rootSnap{}, "", fmt.Errorf("no snapshot has upper directory %s: %w", c.Root.Upperdir, errdefs.ErrNotFound)
		}
		key, fromUpper = k, b
	default:
		return rootSnap{}, "", fmt.Errorf("no root snapshot named (give a key or an upper directory): %w", errdefs.ErrInvalidArgument)
	}
	_, info, _, err := storage.GetInfo(ctx, key)
	if err != nil {
		return rootSnap{}, "", fmt.Errorf("root snapshot %q: %w", key, err)
	}
	if info.Kind != snapshots.KindActive {
		return rootSnap{}, "", fmt.Errorf("snapshot %q is %s snapshot; only active snapshots (a container's rootfs) can be branched: %w", key, kindName(info.Kind), errdefs.ErrFailedPrecondition)
	}
	snap, err := storage.GetSnapshot(ctx, key)
	if err != nil {
		return rootSnap{}, "", fmt.Errorf("root snapshot %q: %w", key, err)
	}
	id := c.Branch
	if id == "" {
		id = branch.RootID
	}
	if fromUpper != "" {
		if c.Branch != "" && c.Branch != fromUpper {
			return rootSnap{}, "", fmt.Errorf("upper directory names branch %s but branch %s was asked for: %w", fromUpper, c.Branch, errdefs.ErrInvalidArgument)
		}
		id = fromUpper
	}
	if _, err := strconv.ParseUint(id, 10, 64); err != nil {
		return rootSnap{}, "", fmt.Errorf("branch id %q is not a number: %w", id, errdefs.ErrInvalidArgument)
	}
	return rootSnap{key: key, snap: snap, idmap: s.idMappingOf(snap, info.Labels)}, id, nil
}

// parseUpperdir checks that dir is the upper directory of a snapshot or of a
// branch in this snapshotter's root, and returns the snapshot id and, for a
// branch, its id. Only the lexical form is trusted: nothing is followed.
func (s *Branches) parseUpperdir(dir string) (snapID, branchID string, err error) {
	bad := func(why string) (string, string, error) {
		return "", "", fmt.Errorf("upper directory %q %s: %w", dir, why, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return bad("must be an absolute, clean path")
	}
	if !strings.HasPrefix(dir, s.root+"/") {
		return bad("is not inside the snapshotter root " + s.root)
	}
	root, snapID, branchID, ok := branch.SplitUpper(dir)
	if !ok || root != s.root {
		return bad("is not a snapshot's or a branch's upper directory")
	}
	return snapID, branchID, nil
}

func (s *store) branchDir(rootID, id string) string {
	return filepath.Join(s.root, "branches", rootID, id)
}

// branchUpper is the upper directory of a branch: the root snapshot's
// own, or a branch's.
func (s *store) branchUpper(rootID, id string) string {
	if id == branch.RootID {
		return s.upperPath(rootID)
	}
	return filepath.Join(s.branchDir(rootID, id), "fs")
}

// branchOverlay returns the overlay mount of a branch: its upper over its
// ancestors' uppers over the root snapshot's own layers.
func (s *Branches) branchOverlay(r rootSnap, t *branch.Tree, id string, readonly bool) []mount.Mount {
	if id == branch.RootID {
		m := s.mounts(r.snap, r.idmap)
		if readonly {
			m[0].Options = withReadonly(m[0].Options)
		}
		return m
	}
	lowers := s.lowerDirs(r, t, id)
	dir := s.branchDir(r.id(), id)
	options := []string{
		"workdir=" + filepath.Join(dir, "work"),
		"upperdir=" + filepath.Join(dir, "fs"),
		"lowerdir=" + strings.Join(lowers, ":"),
	}
	options = append(options, s.options...)
	if readonly {
		options = withReadonly(options)
	}
	return []mount.Mount{{Type: "overlay", Source: "overlay", Options: options}}
}

// Tree returns the branch tree of a root snapshot: every branch still
// known, with its state, epoch, upper size and age.
func (s *Branches) Tree(ctx context.Context, root branch.Root) (TreeInfo, error) {
	var (
		r     rootSnap
		tree  *branch.Tree
		ended []branch.Node
		cause error
	)
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if r, _, err = s.resolve(ctx, branch.Ref{Root: root}); err != nil {
			return err
		}
		if cause = s.usable(r); cause != nil {
			// Shown as far as it can be read: the tree is what to look at.
			if tree, err = loadTree(tx, r.id()); err != nil {
				tree = nil
			}
			return nil
		}
		if tree, err = loadTree(tx, r.id()); err != nil {
			return err
		}
		ended, err = tombstones(tx, r.id())
		return err
	})
	if err != nil {
		return TreeInfo{}, fmt.Errorf("tree: %w", err)
	}
	if tree == nil {
		tree = branch.NewTree(r.key, time.Time{})
	}
	tree.SetTombstones(nil)
	out := TreeInfo{Root: r.key}
	if cause != nil {
		out.Quarantine = cause.Error()
	}
	ids := make([]string, 0, len(tree.Nodes))
	for id := range tree.Nodes {
		ids = append(ids, id)
	}
	sortNumeric(ids)
	for _, id := range ids {
		out.Nodes = append(out.Nodes, s.describe(ctx, r, tree, id, true))
	}
	for _, n := range ended {
		out.Nodes = append(out.Nodes, branch.Info{Node: n})
	}
	sort.SliceStable(out.Nodes, func(i, j int) bool { return numLess(out.Nodes[i].ID, out.Nodes[j].ID) })
	return out, nil
}

// BranchMounts returns the mounts of a branch. A sealed branch's mounts
// are read-only: its layer is its children's lower.
func (s *Branches) BranchMounts(ctx context.Context, c branch.Ref) ([]mount.Mount, error) {
	var (
		out   []mount.Mount
		ended error
	)
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		r, id, err := s.resolve(ctx, c)
		if err != nil {
			return err
		}
		if err := s.usable(r); err != nil {
			return err
		}
		tree, err := loadTree(tx, r.id())
		if err != nil {
			return err
		}
		if tree == nil {
			tree = branch.NewTree(r.key, time.Time{})
		}
		if _, err := tree.Get(id); err != nil {
			ended = err
			return nil
		}
		if err := s.ensureIDMapView(ctx, r); err != nil {
			return err
		}
		out = s.branchOverlay(r, tree, id, tree.Sealed(id))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("mounts of %s: %w", c, err)
	}
	// Why the branch is not usable names it already: the answer a call on
	// an ended branch gives (stale, aborted, committed).
	return out, ended
}

func (s *Branches) describe(ctx context.Context, r rootSnap, tree *branch.Tree, id string, usage bool) branch.Info {
	n := tree.Nodes[id]
	info := branch.Info{Node: *n, Sealed: tree.Sealed(id), Children: tree.Children(id)}
	if n.State == branch.Live || n.State == branch.Committing {
		if usage {
			// Its processes may be writing and removing files meanwhile.
			if du, err := diskUsage(ctx, s.branchUpper(r.id(), id)); err == nil {
				info.UpperSize, info.UpperInodes = du.Size, du.Inodes
			}
		}
		if n.State == branch.Live {
			info.Mounts = s.branchOverlay(r, tree, id, info.Sealed)
		}
	}
	return info
}

// overlayMountsOrNone reads the overlay mounts; on failure it logs and
// returns none, so that removals go on (Cleanup detaches what they miss).
func overlayMountsOrNone(ctx context.Context) overlay.Table {
	t, err := overlay.ReadTable()
	if err != nil {
		log.G(ctx).WithError(err).Warn("read mounts")
	}
	return t
}

// setSealed seals or unseals the branch n (whose upper is upper) the way
// its seal was made: its superblock, each recorded mount, or nothing (the
// caller's seal: its processes were frozen).
func (s *Branches) setSealed(ctx context.Context, mounts overlay.Table, upper string, n *branch.Node, sealed bool) error {
	switch n.SealMode {
	case branch.SealCaller:
		return nil
	case branch.SealMounts:
		return overlay.SetEachRecorded(ctx, s.sealer, n.SealedMounts, upper, sealed)
	}
	live := mounts.Live(upper)
	if live.Target == "" || live.Readonly == sealed {
		return nil
	}
	if err := overlay.Remount(live, sealed); err != nil {
		return err
	}
	log.G(ctx).WithFields(log.Fields{"mount": live.Target, "sealed": sealed}).Debug("seal changed")
	return nil
}

// withReadonly returns options with "rw" dropped and "ro" added.
func withReadonly(options []string) []string {
	out := make([]string, 0, len(options)+1)
	for _, o := range options {
		if o != "rw" && o != "ro" {
			out = append(out, o)
		}
	}
	return append(out, "ro")
}

func ownerOf(path string) (int, int, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return 0, 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return int(st.Uid), int(st.Gid), nil
}

func sortNumeric(ids []string) {
	sort.Slice(ids, func(i, j int) bool { return numLess(ids[i], ids[j]) })
}

func numLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

func getSnapshot(ctx context.Context, key string) (storage.Snapshot, error) {
	return storage.GetSnapshot(ctx, key)
}
