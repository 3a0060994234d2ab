//go:build linux

package snapshotter

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/apply"
)

// Branch layers live beside the snapshots they branch from:
//
//	<root>/branches/<root snapshot id>/<branch id>/fs    the branch's upper
//	<root>/branches/<root snapshot id>/<branch id>/work  its overlay workdir
//	<root>/mnt/<root snapshot id>-<context>              a temporary mount of
//	                                                     a context being committed into
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

// Root names a root snapshot: by key, or by its upper directory (which is
// what a shim sees in the mounts containerd hands it). An upper directory of
// a branch names that branch.
type Root struct {
	Key      string
	Upperdir string
}

// String names the root in messages as its user knows it: by the key
// they gave, or, named by its upper directory (a shim's call), as the
// sandbox's root snapshot (the shim adds the sandbox's name; the path is
// internal).
func (r Root) String() string {
	if r.Key != "" {
		return branch.DisplayKey(r.Key)
	}
	return "the sandbox's root snapshot"
}

// Context names the root context ("" or branch.RootID) or a branch of a root.
type Context struct {
	Root   Root
	Branch string
}

// BranchInfo describes one node of a branch tree.
type BranchInfo struct {
	branch.Node
	Sealed      bool
	Children    []string
	UpperSize   int64
	UpperInodes int64
	Mounts      []mount.Mount
}

// TreeInfo is a branch tree with the state of every node.
type TreeInfo struct {
	Root  string
	Nodes []BranchInfo
	// Quarantine, if not "", says that the tree's recovery failed and why:
	// its branch operations are refused (quarantine.go).
	Quarantine string
}

// CommitResult says what a commit did.
type CommitResult struct {
	Plan   branch.CommitPlan
	Parent BranchInfo
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

// rootLocks serialises the filesystem phases of branch operations per root
// snapshot; the metadata transactions serialise the decisions themselves.
type rootLocks struct {
	mu    sync.Mutex
	locks map[string]*treeLock
}

// treeLock is one root's lock. sealing, set and read under mu, is closed
// when a fork's superblock seal, still running after the fork returned,
// ends (see sealSuperblock); until then nothing may remount the tree.
type treeLock struct {
	mu      sync.Mutex
	sealing chan struct{}
}

func (l *treeLock) awaitSeal() {
	if l.sealing != nil {
		<-l.sealing
		l.sealing = nil
	}
}

func (r *rootLocks) entry(id string) *treeLock {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.locks == nil {
		r.locks = map[string]*treeLock{}
	}
	l, ok := r.locks[id]
	if !ok {
		l = &treeLock{}
		r.locks[id] = l
	}
	return l
}

// lock takes the root's lock once a pending seal has ended.
func (r *rootLocks) lock(id string) func() {
	unlock, awaitSeal := r.lockBeforeSeal(id)
	awaitSeal()
	return unlock
}

// lockBeforeSeal takes the root's lock without waiting for a pending seal:
// the caller calls awaitSeal (with the lock held) before it reads or
// changes a mount, and may do other work first.
func (r *rootLocks) lockBeforeSeal(id string) (unlock, awaitSeal func()) {
	l := r.entry(id)
	l.mu.Lock()
	return l.mu.Unlock, l.awaitSeal
}

// sealing records a pending seal of the root, whose lock the caller holds.
func (r *rootLocks) sealing(id string, done chan struct{}) {
	r.entry(id).sealing = done
}

func (s *Snapshotter) fault(point string) {
	if s.faultHook != nil {
		s.faultHook(point)
	}
}

// rootSnap is a resolved root snapshot.
type rootSnap struct {
	key  string
	snap storage.Snapshot
}

func (r rootSnap) id() string { return r.snap.ID }

// loadTree reads the tree of a root snapshot, nil if it has none. Its
// tombstones are read through tx, so the tree must not be asked about
// ended nodes after tx ends.
func loadTree(tx *bolt.Tx, rootID string) (*branch.Tree, error) {
	trees := nestedBucket(tx, bucketBranchbox, bucketTrees)
	if trees == nil {
		return nil, nil
	}
	v := trees.Get([]byte(rootID))
	if v == nil {
		return nil, nil
	}
	var t branch.Tree
	if err := json.Unmarshal(v, &t); err != nil {
		return nil, fmt.Errorf("decode branch tree of snapshot %s: %v: %w", rootID, err, errdefs.ErrDataLoss)
	}
	t.SetTombstones(func(id string) *branch.Node {
		ended := nestedBucket(tx, bucketBranchbox, bucketEnded, rootID)
		if ended == nil {
			return nil
		}
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			return nil
		}
		var node branch.Node
		if v := ended.Get(idKey(n)); v == nil || json.Unmarshal(v, &node) != nil {
			return nil
		}
		return &node
	})
	return &t, nil
}

// storeTree writes the tree and moves the nodes that ended into its
// tombstones, keeping the newest maxTombstones.
func storeTree(tx *bolt.Tx, rootID string, t *branch.Tree) error {
	b, err := tx.CreateBucketIfNotExists([]byte(bucketBranchbox))
	if err != nil {
		return err
	}
	trees, err := b.CreateBucketIfNotExists([]byte(bucketTrees))
	if err != nil {
		return err
	}
	v, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if err := trees.Put([]byte(rootID), v); err != nil {
		return err
	}
	if err := pruneCheckpoints(tx, rootID, t); err != nil {
		return err
	}
	endedNodes := t.TakeEnded()
	if len(endedNodes) == 0 {
		return nil
	}
	all, err := b.CreateBucketIfNotExists([]byte(bucketEnded))
	if err != nil {
		return err
	}
	ended, err := all.CreateBucketIfNotExists([]byte(rootID))
	if err != nil {
		return err
	}
	for _, n := range endedNodes {
		id, err := strconv.ParseUint(n.ID, 10, 64)
		if err != nil {
			return fmt.Errorf("branch id %q: %w", n.ID, errdefs.ErrInternal)
		}
		v, err := json.Marshal(n)
		if err != nil {
			return err
		}
		if err := ended.Put(idKey(id), v); err != nil {
			return err
		}
	}
	// Keys are big-endian ids, so the first ones are the oldest: keep the
	// last maxTombstones.
	c := ended.Cursor()
	k, _ := c.Last()
	for i := 1; i < maxTombstones && k != nil; i++ {
		k, _ = c.Prev()
	}
	if k == nil {
		return nil
	}
	var drop [][]byte
	for k, _ = c.Prev(); k != nil; k, _ = c.Prev() {
		drop = append(drop, append([]byte(nil), k...))
	}
	for _, k := range drop {
		if err := ended.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// tombstones lists the ended nodes of a tree, oldest first.
func tombstones(tx *bolt.Tx, rootID string) ([]branch.Node, error) {
	ended := nestedBucket(tx, bucketBranchbox, bucketEnded, rootID)
	if ended == nil {
		return nil, nil
	}
	var out []branch.Node
	err := ended.ForEach(func(_, v []byte) error {
		var n branch.Node
		if err := json.Unmarshal(v, &n); err != nil {
			return fmt.Errorf("decode tombstone: %v: %w", err, errdefs.ErrDataLoss)
		}
		out = append(out, n)
		return nil
	})
	return out, err
}

func deleteTree(tx *bolt.Tx, rootID string) error {
	if err := deleteCheckpoints(tx, rootID); err != nil {
		return err
	}
	if trees := nestedBucket(tx, bucketBranchbox, bucketTrees); trees != nil {
		if err := trees.Delete([]byte(rootID)); err != nil {
			return err
		}
	}
	if all := nestedBucket(tx, bucketBranchbox, bucketEnded); all != nil && all.Bucket([]byte(rootID)) != nil {
		return all.DeleteBucket([]byte(rootID))
	}
	return nil
}

// allTrees lists every stored tree by root snapshot id, and apart from
// them the trees that cannot be decoded, with why.
func allTrees(tx *bolt.Tx) (map[string]*branch.Tree, map[string]error, error) {
	out, bad := map[string]*branch.Tree{}, map[string]error{}
	trees := nestedBucket(tx, bucketBranchbox, bucketTrees)
	if trees == nil {
		return out, bad, nil
	}
	var ids []string
	if err := trees.ForEach(func(k, _ []byte) error { ids = append(ids, string(k)); return nil }); err != nil {
		return nil, nil, err
	}
	for _, id := range ids {
		t, err := loadTree(tx, id)
		if err != nil {
			bad[id] = err
			continue
		}
		out[id] = t
	}
	return out, bad, nil
}

func nestedBucket(tx *bolt.Tx, names ...string) *bolt.Bucket {
	b := tx.Bucket([]byte(names[0]))
	for _, n := range names[1:] {
		if b == nil {
			return nil
		}
		b = b.Bucket([]byte(n))
	}
	return b
}

func idKey(id uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], id)
	return k[:]
}

// resolve finds the root snapshot and the branch a Context names. It must
// run inside a metadata transaction.
func (s *Snapshotter) resolve(ctx context.Context, c Context) (rootSnap, string, error) {
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
	return rootSnap{key: key, snap: snap}, id, nil
}

// parseUpperdir checks that dir is the upper directory of a snapshot or of a
// branch in this snapshotter's root, and returns the snapshot id and, for a
// branch, its id. Only the lexical form is trusted: nothing is followed.
func (s *Snapshotter) parseUpperdir(dir string) (snapID, branchID string, err error) {
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

func (s *Snapshotter) branchDir(rootID, id string) string {
	return filepath.Join(s.root, "branches", rootID, id)
}

// contextUpper is the upper directory of a context: the root snapshot's
// own, or a branch's.
func (s *Snapshotter) contextUpper(rootID, id string) string {
	if id == branch.RootID {
		return s.upperPath(rootID)
	}
	return filepath.Join(s.branchDir(rootID, id), "fs")
}

// contextMounts returns the overlay mount of a context: its upper over its
// ancestors' uppers over the root snapshot's own layers.
func (s *Snapshotter) contextMounts(r rootSnap, t *branch.Tree, id string, readonly bool) []mount.Mount {
	if id == branch.RootID {
		m := s.mounts(r.snap)
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

// Fork makes count children of the context c over its current state and
// seals c (its live mounts become read-only) until its last child ends.
func (s *Snapshotter) Fork(ctx context.Context, c Context, count int) ([]BranchInfo, error) {
	return s.ForkFrom(ctx, c, count, "")
}

// ForkFrom is Fork; with a checkpoint named (one of c's own), the children
// start from that checkpoint's state instead of c's current one, and
// committing one replaces c's state with the child's.
func (s *Snapshotter) ForkFrom(ctx context.Context, c Context, count int, from string, opts ...ForkOption) (_ []BranchInfo, retErr error) {
	var o forkOptions
	for _, opt := range opts {
		opt(&o)
	}
	if count < 1 || count > 1024 {
		return nil, fmt.Errorf("fork: count must be between 1 and 1024, got %d: %w", count, errdefs.ErrInvalidArgument)
	}
	var (
		r       rootSnap
		parent  string
		kids    []string
		tree    *branch.Tree
		created []string
		// wasSealed: the parent had live children already, and is sealed.
		wasSealed bool
	)
	// Resolve first, unlocked, to learn which root to lock.
	if err := s.withTx(ctx, false, func(ctx context.Context, _ *bolt.Tx) (err error) {
		r, parent, err = s.resolve(ctx, c)
		return err
	}); err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	if err := s.usable(r); err != nil {
		return nil, fmt.Errorf("fork %s: %w", c, err)
	}
	defer s.locks.lock(r.id())()
	parentUpper := s.contextUpper(r.id(), parent)
	live, err := s.live.find(parentUpper)
	if err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}

	defer func() {
		if retErr != nil {
			for _, d := range created {
				if err := os.RemoveAll(d); err != nil {
					log.G(ctx).WithError(err).WithField("path", d).Warn("remove directory of failed fork; Cleanup will retry")
				}
			}
		}
	}()
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if r, parent, err = s.resolve(ctx, c); err != nil {
			return err
		}
		if tree, err = loadTree(tx, r.id()); err != nil {
			return err
		}
		if tree == nil {
			tree = branch.NewTree(r.key, time.Now())
		}
		if tree.Depth(parent) >= maxDepth {
			return fmt.Errorf("%s is %d levels deep, the most this snapshotter stacks: %w", c, tree.Depth(parent), errdefs.ErrFailedPrecondition)
		}
		wasSealed = tree.Sealed(parent)
		if kids, err = tree.Fork(parent, count, time.Now()); err != nil {
			return err
		}
		if from != "" {
			d, err := loadCheckpoints(tx, r.id())
			if err != nil {
				return err
			}
			ck := d.Checkpoints[from]
			if ck == nil {
				return fmt.Errorf("no checkpoint named %q in %s: %w", from, branch.DisplayKey(r.key), errdefs.ErrNotFound)
			}
			if ck.Context != parent {
				return fmt.Errorf("checkpoint %q is of context %s, not of the one forked (%s); fork that context: %w", from, ck.Context, parent, errdefs.ErrInvalidArgument)
			}
			for _, id := range kids {
				tree.Nodes[id].FromCheckpoint = from
				tree.Nodes[id].CheckpointLayers = append([]uint64(nil), ck.Chain...)
			}
		}
		uid, gid, err := ownerOf(parentUpper)
		if err != nil {
			return err
		}
		for _, id := range kids {
			dir := s.branchDir(r.id(), id)
			created = append(created, dir)
			if err := makeBranchDir(dir, uid, gid); err != nil {
				return err
			}
		}
		if from != "" {
			// The root of the merged view shows the upper's own root: give
			// it the checkpoint's.
			top := filepath.Join(s.checkpointDir(r.id(), tree.Nodes[kids[0]].CheckpointLayers[0]), "fs")
			for _, id := range kids {
				if err := copyDirAttrs(top, s.contextUpper(r.id(), id)); err != nil {
					return err
				}
			}
		}
		s.fault(FaultForkDirs)
		// Only a mount that was writable is ours to seal and later unseal: a
		// read-only rootfs stays read-only.
		if live.target != "" && !live.readonly && !wasSealed {
			p := tree.Nodes[parent]
			p.SealedByUs, p.SealMode, p.SealedMounts = true, branch.SealSuperblock, nil
			if o.parentFrozen {
				p.SealMode = branch.SealCaller
			}
		}
		return storeTree(tx, r.id(), tree)
	})
	if err != nil {
		return nil, fmt.Errorf("fork %s: %w", c, err)
	}
	created = nil
	s.fault(FaultForkCommitted)

	if p := tree.Nodes[parent]; p.SealedByUs && !wasSealed && p.SealMode == branch.SealSuperblock {
		err := s.sealSuperblock(ctx, r.id(), live)
		if errors.Is(err, errSuperblockBusy) {
			err = s.sealEachMount(ctx, r, parent, c.String())
		}
		if err != nil {
			// Undo: the children never existed for anyone.
			if uerr := s.abortAll(ctx, r, kids); uerr != nil {
				log.G(ctx).WithError(uerr).Warn("undo fork after failed seal")
			}
			return nil, fmt.Errorf("fork %s: seal the parent: %w", c, err)
		}
	}
	out := make([]BranchInfo, len(kids))
	for i, id := range kids {
		out[i] = BranchInfo{Node: *tree.Nodes[id], Mounts: s.contextMounts(r, tree, id, false)}
	}
	log.G(ctx).WithFields(log.Fields{"root": r.key, "parent": parent, "children": kids}).Info("forked")
	return out, nil
}

// sealSuperblock makes the superblock of the overlay mounted at live
// read-only, which reaches every mount of it (the container's own root in
// its mount namespace, and any copy of that namespace). The caller holds
// the lock of root id.
//
// The remount first checks that no mount of the superblock has a file open
// for writing and from then on refuses every write; then overlayfs makes it
// sync the whole upper filesystem (0.2 ms to several here), which a seal
// does not need. So the remount runs on a seal thread (sealthreads_linux.go)
// and sealSuperblock returns as soon as a probe write through live.target
// is refused, or with the remount's error if it fails first. The root's
// lock is not taken again (nor is the tree remounted) before the remount
// ends.
func (s *Snapshotter) sealSuperblock(ctx context.Context, id string, live liveMountInfo) error {
	run := s.seals.remount(ctx, live)
	probed := false
wait:
	for spin := 0; ; spin++ {
		// The seal thread runs on this CPU when this thread yields it, and
		// gives it back once its remount blocks, past the read-only point
		// (sealthreads_linux.go). One that has not issued the remount soon
		// is waiting for a P, both being busy: yield this one to it.
		switch {
		case spin >= 400:
			time.Sleep(50 * time.Microsecond)
		case !run.issued.Load() && spin >= 4:
			runtime.Gosched()
		default:
			yieldCPU()
		}
		if !run.issued.Load() {
			continue
		}
		select {
		case err := <-run.result:
			run.settle()
			run.release()
			if err != nil && probed && errors.Is(err, errdefs.ErrFailedPrecondition) {
				// The probe itself may have been the writer the remount saw:
				// try once more without it.
				err = remountLive(live, true)
			}
			return err
		default:
		}
		if probeRefused(live.target) {
			break wait
		}
		probed = true
	}
	run.settle()
	done := make(chan struct{})
	s.locks.sealing(id, done)
	ctx = context.WithoutCancel(ctx)
	s.sealWG.Add(1)
	go func() {
		defer s.sealWG.Done()
		defer close(done)
		err := <-run.result
		run.release()
		if err != nil {
			// Past the writer check only an I/O error can fail it.
			log.G(ctx).WithError(err).WithField("mount", live.target).Error("seal a forked parent's superblock: the remount failed after it had made the parent read-only")
		}
	}()
	return nil
}

// maxDepth bounds how deep branches nest: each level is one more overlay
// lower layer, and the kernel stacks at most 500.
const maxDepth = 256

// abortAll discards the given branches of r (used to undo a failed fork).
func (s *Snapshotter) abortAll(ctx context.Context, r rootSnap, ids []string) error {
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		tree, err := loadTree(tx, r.id())
		if err != nil || tree == nil {
			return err
		}
		for _, id := range ids {
			if _, err := tree.Abort(id, time.Now()); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
		}
		for id, n := range tree.Nodes {
			if n.SealedByUs && !tree.Sealed(id) {
				clearSeal(n)
			}
		}
		return storeTree(tx, r.id(), tree)
	})
	if err != nil {
		return err
	}
	mounts := overlayMountsOrNone(ctx)
	for _, id := range ids {
		s.removeBranchLayer(ctx, mounts, r.id(), id)
	}
	return nil
}

// CommitBranch makes branch c's changes its parent's. The first commit
// into a parent wins: every sibling and its descendants become stale and
// their layers are discarded. A parent that is mounted is changed through
// its mount, so its running processes see the commit at once; one that is
// not is mounted for the commit and unmounted after.
//
// What can be known before the decision is checked first (checkCommit): a
// commit that cannot apply is refused with nothing changed. The decision
// is one metadata transaction; from then on the commit is carried through
// whatever the caller does: a caller whose context ends gets an error, the
// commit goes on, and a later call sees its result. Should the apply still
// fail, the parent is put back as it was (commitundo.go) and the branch
// stays committing: calling commit again applies it anew, aborting it
// abandons it. A crash after the decision is completed by recovery.
func (s *Snapshotter) CommitBranch(ctx context.Context, c Context) (CommitResult, error) {
	for attempt := 0; ; attempt++ {
		res, err := s.commitBranch(ctx, c)
		// The branch became a live leaf after the check was skipped, or its
		// parent moved on: check again.
		if errors.Is(err, errCheckAgain) {
			if attempt < 3 {
				continue
			}
			return res, fmt.Errorf("commit %s: the branch kept changing while it was checked; try again: %w", c, errdefs.ErrAborted)
		}
		return res, err
	}
}

// errCheckAgain says the pre-decision check no longer holds.
var errCheckAgain = errors.New("the branch changed since it was checked")

// checked is what the pre-decision check saw, and its refusal if it
// refused: it holds while the branch is still a live leaf of the same
// parent at the same epoch.
type checked struct {
	parent string
	epoch  uint64
	err    error
}

func (s *Snapshotter) commitBranch(ctx context.Context, c Context) (CommitResult, error) {
	var (
		r       rootSnap
		id      string
		plan    branch.CommitPlan
		resume  bool
		decided *branch.Tree
		done    *CommitResult
	)
	// Unlocked: which root to lock, and the check of a live leaf (it reads
	// only what cannot change while the branch is a live leaf; the
	// decision checks that it still is, before it takes a refusal: a
	// sibling's commit may have removed the branch meanwhile).
	done, check, err := s.commitPrecheck(ctx, c, &r, &id)
	if err != nil {
		return CommitResult{}, err
	}
	if done != nil {
		return *done, nil
	}
	if err := ctx.Err(); err != nil && (check == nil || check.err == nil) {
		return CommitResult{}, fmt.Errorf("commit %s (not decided, nothing changed): %w", c, err)
	}
	if s.quarantined.cause(r.id()) != nil {
		// A commit the recovery could not complete is retried here, as its
		// error said it would be.
		if _, err := s.recoverRoot(ctx, r.id()); err == nil {
			s.quarantined.lift(r.id())
			// Recovered (the commit completed, perhaps): look again, so
			// that a completed commit answers with its result.
			return CommitResult{}, errCheckAgain
		} else {
			s.quarantined.add(r.id(), err)
		}
		if err := s.usable(r); err != nil {
			return CommitResult{}, fmt.Errorf("commit %s: %w", c, err)
		}
	}
	// A fork's seal still syncing is waited for only once the decision is
	// made: the decision's own sync overlaps it.
	unlock, awaitSeal := s.locks.lockBeforeSeal(r.id())
	handedOff := false
	defer func() {
		if !handedOff {
			unlock()
		}
	}()
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if r, id, err = s.resolve(ctx, c); err != nil {
			return err
		}
		tree, err := loadTree(tx, r.id())
		if err != nil {
			return err
		}
		if tree == nil {
			tree = branch.NewTree(r.key, time.Now())
		}
		// Committed meanwhile (by a call this one waited for).
		if n, ok := tree.Ended(id); ok && n.State == branch.Committed {
			done, err = s.committedResult(ctx, tx, r, tree, n)
			return err
		}
		// A commit that was decided but failed to finish is resumed.
		n := tree.Nodes[id]
		if n != nil && n.State == branch.Committing {
			resume = true
			plan = branch.CommitPlan{Winner: id, Parent: n.Parent, Epoch: n.WinnerEpoch}
			return nil
		}
		if n != nil && n.State == branch.Live {
			if p := tree.Nodes[n.Parent]; p != nil && len(tree.Children(id)) == 0 {
				if check == nil || check.parent != p.ID || check.epoch != p.Epoch {
					return errCheckAgain
				}
				if check.err != nil {
					return check.err
				}
			}
		}
		if plan, err = tree.BeginCommit(id, time.Now()); err != nil {
			return err
		}
		if err := storeTree(tx, r.id(), tree); err != nil {
			return err
		}
		decided = tree
		return nil
	})
	if errors.Is(err, errCheckAgain) || (check != nil && err == check.err && err != nil) {
		return CommitResult{}, err
	}
	if err != nil {
		return CommitResult{}, fmt.Errorf("commit %s: %w", c, err)
	}
	if done != nil {
		return *done, nil
	}
	if decided != nil {
		// Kept past its transaction: nothing below asks it about ended nodes.
		decided.SetTombstones(nil)
	}
	// Decided: carried through on a context the caller cannot end, holding
	// the root's lock until done.
	type outcome struct {
		res CommitResult
		err error
	}
	out := make(chan outcome, 1)
	handedOff = true
	s.commitWG.Add(1)
	go func() {
		defer s.commitWG.Done()
		defer unlock()
		res, err := s.carryOutCommit(context.WithoutCancel(ctx), c, r, plan, resume, decided, awaitSeal)
		if err != nil && ctx.Err() != nil {
			// Its caller went away: the log is the only one told.
			log.G(ctx).WithError(err).WithFields(log.Fields{"root": r.key, "branch": plan.Winner}).Warn("decided commit failed after its caller went away")
		}
		out <- outcome{res, err}
	}()
	select {
	case o := <-out:
		return o.res, o.err
	case <-ctx.Done():
		return CommitResult{}, fmt.Errorf("commit %s: decided (it won at epoch %d) and being applied; that goes on without this caller: call commit again to see its result: %w", c, plan.Epoch, ctx.Err())
	}
}

// commitPrecheck resolves c and runs, before the decision, the checks of
// checkCommit on a live leaf branch, returning what it checked. For a
// branch that was committed already it returns that commit's result
// instead. Anything else (a stale or committing branch, one with children)
// is left to the decision to answer.
func (s *Snapshotter) commitPrecheck(ctx context.Context, c Context, r *rootSnap, id *string) (*CommitResult, *checked, error) {
	var (
		tree  *branch.Tree
		node  *branch.Node
		seen  checked
		ended *CommitResult
	)
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if *r, *id, err = s.resolve(ctx, c); err != nil {
			return err
		}
		if tree, err = loadTree(tx, r.id()); err != nil || tree == nil {
			return err
		}
		if n, ok := tree.Ended(*id); ok && n.State == branch.Committed {
			ended, err = s.committedResult(ctx, tx, *r, tree, n)
			return err
		}
		if n := tree.Nodes[*id]; n != nil && n.State == branch.Live && n.ID != branch.RootID && len(tree.Children(n.ID)) == 0 {
			if p := tree.Nodes[n.Parent]; p != nil && p.State == branch.Live {
				node, seen = n, checked{parent: p.ID, epoch: p.Epoch}
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("commit: %w", err)
	}
	if ended != nil || node == nil {
		return ended, nil, nil
	}
	tree.SetTombstones(nil)
	if err := s.checkCommit(ctx, *r, tree, node); err != nil {
		seen.err = fmt.Errorf("commit %s (refused, nothing changed): %w", c, err)
	}
	return nil, &seen, nil
}

// committedResult is what the commit of n (committed, a tombstone) did,
// for a caller that asks again.
func (s *Snapshotter) committedResult(ctx context.Context, tx *bolt.Tx, r rootSnap, tree *branch.Tree, n branch.Node) (*CommitResult, error) {
	plan := branch.CommitPlan{Winner: n.ID, Parent: n.Parent, Epoch: n.WinnerEpoch}
	ended, err := tombstones(tx, r.id())
	if err != nil {
		return nil, err
	}
	for _, e := range ended {
		if e.State == branch.Stale && e.Winner == n.ID && e.WinnerEpoch == n.WinnerEpoch {
			plan.Invalidated = append(plan.Invalidated, e.ID)
		}
	}
	sortNumeric(plan.Invalidated)
	if tree.Nodes[n.Parent] == nil {
		return nil, fmt.Errorf("branch %s was committed into %s (epoch %d), which has ended since: %w", n.ID, contextName(n.Parent), n.WinnerEpoch, errdefs.ErrNotFound)
	}
	tree.SetTombstones(nil)
	return &CommitResult{Plan: plan, Parent: s.describe(ctx, r, tree, n.Parent, false)}, nil
}

// carryOutCommit does everything after a commit's decision. The caller
// holds the root's lock.
func (s *Snapshotter) carryOutCommit(ctx context.Context, c Context, r rootSnap, plan branch.CommitPlan, resume bool, decided *branch.Tree, awaitSeal func()) (CommitResult, error) {
	// Whether the parent is as before if this attempt fails before its
	// apply changes anything: after a first decision, or after an attempt
	// that was undone.
	clean := !resume || s.undone.isClean(r.id(), plan.Winner)
	// The decision must outlive a power loss before the parent changes, so
	// that a half-applied commit is completed rather than left (branchdb.go).
	// Only reads overlap the sync; nothing changes until it is done.
	synced := make(chan error, 1)
	if resume {
		synced <- nil
	} else {
		go func() { synced <- s.bdb.Sync() }()
	}
	awaitSeal()
	// Read once: the losers' entries are the only ones that go stale, and
	// nothing below asks about them again.
	mounts, mountsErr := readOverlayMounts()
	if err := <-synced; err != nil {
		s.undone.set(r.id(), plan.Winner, clean)
		return CommitResult{}, fmt.Errorf("commit %s (decided: it won at epoch %d; calling commit again completes it): sync branch metadata: %w", c, plan.Epoch, err)
	}
	s.fault(FaultCommitDecided)
	if mountsErr != nil {
		s.undone.set(r.id(), plan.Winner, clean)
		return CommitResult{}, fmt.Errorf("commit %s (decided: it won at epoch %d; calling commit again, or a restart, completes it): %w", c, plan.Epoch, mountsErr)
	}
	// The losers go first: their processes must not keep writing into
	// layers that are about to be discarded.
	for _, l := range plan.Invalidated {
		s.removeBranchLayer(ctx, mounts, r.id(), l)
	}
	tree, err := s.finishCommit(ctx, r, plan.Winner, resume, mounts, decided)
	if err != nil {
		return CommitResult{}, fmt.Errorf("commit %s (decided: it won at epoch %d): %w", c, plan.Epoch, err)
	}
	log.G(ctx).WithFields(log.Fields{"root": r.key, "winner": plan.Winner, "parent": plan.Parent, "epoch": plan.Epoch, "invalidated": plan.Invalidated}).Info("committed")
	if tree.Nodes[plan.Parent] == nil {
		return CommitResult{}, fmt.Errorf("commit %s: parent %s left the tree: %w", c, plan.Parent, errdefs.ErrNotFound)
	}
	return CommitResult{Plan: plan, Parent: s.describe(ctx, r, tree, plan.Parent, false)}, nil
}

// finishCommit applies a committing branch's layer to its parent and ends
// the commit. It is idempotent: applying an upper layer to a tree that
// already shows it changes nothing, so recovery may run it again. resume
// says an earlier attempt may have been cut short, leaving temporaries.
//
// If the apply or the final transaction fails, what the apply changed in
// the parent is put back from the journal and the branch stays committing;
// the error then says whether the parent is as before.
//
// mounts is the overlay mount table, or nil to read it here; tree is the
// branch tree as the decision left it, or nil to read it here. It returns
// the tree as the commit leaves it, with no tombstones.
func (s *Snapshotter) finishCommit(ctx context.Context, r rootSnap, id string, resume bool, mounts mountTable, tree *branch.Tree) (_ *branch.Tree, retErr error) {
	if tree == nil {
		if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
			tree, err = loadTree(tx, r.id())
			return err
		}); err != nil {
			return nil, err
		}
		if tree == nil {
			return nil, fmt.Errorf("no branch tree for %s: %w", branch.DisplayKey(r.key), errdefs.ErrNotFound)
		}
		tree.SetTombstones(nil)
	}
	n := tree.Nodes[id]
	if n == nil || n.State != branch.Committing {
		return nil, fmt.Errorf("branch %s is not being committed: %w", id, errdefs.ErrFailedPrecondition)
	}
	parentUpper := s.contextUpper(r.id(), n.Parent)
	upper := s.contextUpper(r.id(), id)
	clean := !resume || s.undone.isClean(r.id(), id)
	var (
		journal *apply.Journal
		live    liveMountInfo
	)
	defer func() {
		if journal != nil {
			// Discarded after the restore below, which reads it.
			defer s.discardJournal(ctx, journal)
		}
		if retErr == nil {
			s.undone.set(r.id(), id, false)
			return
		}
		if journal == nil {
			s.undone.set(r.id(), id, clean)
			return
		}
		if err := s.restoreParent(ctx, journal, live.target); err != nil {
			s.undone.set(r.id(), id, false)
			log.G(ctx).WithError(err).WithFields(log.Fields{"root": r.key, "branch": id}).Error("put the parent back after a failed commit")
			retErr = fmt.Errorf("%w; putting %s back as it was failed too (%v): call commit again to complete it", retErr, contextName(n.Parent), err)
			return
		}
		s.undone.set(r.id(), id, clean)
		if clean {
			retErr = fmt.Errorf("%w; %s was put back as it was: call commit again to retry, or abort the branch", retErr, contextName(n.Parent))
		} else {
			retErr = fmt.Errorf("%w; %s was put back as this attempt found it, which may hold part of an earlier one: call commit again to complete it", retErr, contextName(n.Parent))
		}
	}()
	// A commit with the winner's own layer gone already finished applying.
	if _, err := os.Lstat(upper); err == nil {
		// Unmount the winner wherever the host sees it, then apply.
		if mounts == nil {
			var err error
			if mounts, err = readOverlayMounts(); err != nil {
				return nil, err
			}
		}
		mounts.detach(ctx, upper)
		j := s.newJournal(r.id(), id, parentUpper)
		journal = j
		live = mounts.live(parentUpper)
		if live.target != "" {
			if p := tree.Nodes[n.Parent]; p.SealedByUs {
				if err := s.setSealed(ctx, mounts, parentUpper, p, false); err != nil {
					return nil, fmt.Errorf("unseal parent at %s: %w", live.target, err)
				}
			}
			if err := s.rollbackForCommit(ctx, r, tree, n, live.target, j); err != nil {
				return nil, err
			}
			if err := applyLayer(ctx, upper, live.target, parentUpper, resume, j); err != nil {
				return nil, fmt.Errorf("apply branch %s to its parent through %s: %w", id, live.target, err)
			}
		} else if err := s.applyThroughTempMount(ctx, r, tree, n, upper, resume, j); err != nil {
			return nil, err
		}
		s.fault(FaultCommitApplied)
	}
	var done *branch.Tree
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		t, err := loadTree(tx, r.id())
		if err != nil {
			return err
		}
		if t == nil {
			return fmt.Errorf("no branch tree for %s: %w", branch.DisplayKey(r.key), errdefs.ErrNotFound)
		}
		if err := t.FinishCommit(id, time.Now()); err != nil {
			return err
		}
		if p := t.Nodes[n.Parent]; p != nil && !t.Sealed(p.ID) {
			clearSeal(p)
		}
		if err := storeTree(tx, r.id(), t); err != nil {
			return err
		}
		done = t
		return setHead(tx, r.id(), n.Parent, n.FromCheckpoint)
	})
	if err != nil {
		return nil, err
	}
	done.SetTombstones(nil)
	s.fault(FaultCommitFinished)
	s.removeCheckpointOrphans(ctx, r.id())
	// Detached above (or before a crash, or never mounted): only files left.
	s.discard(ctx, s.branchDir(r.id(), id))
	return done, nil
}

// applyThroughTempMount mounts an unmounted context, applies upper through
// that mount, and unmounts it.
func (s *Snapshotter) applyThroughTempMount(ctx context.Context, r rootSnap, tree *branch.Tree, n *branch.Node, upper string, resume bool, j *apply.Journal) (retErr error) {
	id := n.Parent
	target := filepath.Join(s.root, "mnt", r.id()+"-"+id)
	if err := os.MkdirAll(target, 0o700); err != nil {
		return err
	}
	mounts := s.contextMounts(r, tree, id, false)
	if err := mount.All(mounts, target); err != nil {
		os.Remove(target)
		return fmt.Errorf("mount parent for commit: %w", err)
	}
	defer func() {
		if err := mount.UnmountAll(target, 0); err != nil && retErr == nil {
			retErr = fmt.Errorf("unmount parent after commit: %w", err)
		}
		os.Remove(target)
	}()
	if err := s.rollbackForCommit(ctx, r, tree, n, target, j); err != nil {
		return err
	}
	if err := applyLayer(ctx, upper, target, s.contextUpper(r.id(), id), resume, j); err != nil {
		return fmt.Errorf("apply to parent: %w", err)
	}
	return nil
}

// Abort discards branch c and its descendants. Its parent is unsealed when
// its last child ends. A committing branch whose apply failed and was put
// back (see CommitBranch) is abandoned: its parent stays as it was.
func (s *Snapshotter) Abort(ctx context.Context, c Context) ([]string, error) {
	var (
		r    rootSnap
		id   string
		gone []string
		tree *branch.Tree
	)
	if err := s.withTx(ctx, false, func(ctx context.Context, _ *bolt.Tx) (err error) {
		r, id, err = s.resolve(ctx, c)
		return err
	}); err != nil {
		return nil, fmt.Errorf("abort: %w", err)
	}
	if err := s.usable(r); err != nil {
		return nil, fmt.Errorf("abort %s: %w", c, err)
	}
	defer s.locks.lock(r.id())()
	// Read once, under the lock: it serves the unseal and the removals.
	mounts := overlayMountsOrNone(ctx)
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if r, id, err = s.resolve(ctx, c); err != nil {
			return err
		}
		if tree, err = loadTree(tx, r.id()); err != nil {
			return err
		}
		if tree == nil {
			tree = branch.NewTree(r.key, time.Now())
		}
		var parent string
		if n := tree.Nodes[id]; n != nil && n.State == branch.Committing {
			// A commit that was decided but could not be applied: abandoned,
			// if its parent was put back as it was.
			if !s.undone.isClean(r.id(), id) {
				return fmt.Errorf("branch %s is being committed into %s, which may hold part of it; call commit again to complete it: %w", id, contextName(n.Parent), errdefs.ErrFailedPrecondition)
			}
			parent, gone = n.Parent, []string{id}
			if err := tree.AbandonCommit(id, time.Now()); err != nil {
				return err
			}
		} else {
			n, err := tree.Get(id)
			if err != nil {
				return fmt.Errorf("abort: %w", err)
			}
			parent = n.Parent
			if gone, err = tree.Abort(id, time.Now()); err != nil {
				return err
			}
		}
		// The last child of a sealed parent: unseal it before the abort
		// commits. A crash in between leaves the parent writable with the
		// child still recorded, which recovery seals again.
		if p := tree.Nodes[parent]; p != nil && p.SealedByUs && !tree.Sealed(parent) {
			if err := s.setSealed(ctx, mounts, s.contextUpper(r.id(), parent), p, false); err != nil {
				return fmt.Errorf("unseal parent: %w", err)
			}
			clearSeal(p)
		}
		return storeTree(tx, r.id(), tree)
	})
	if err != nil {
		return nil, fmt.Errorf("abort %s: %w", c, err)
	}
	s.undone.set(r.id(), id, false)
	s.fault(FaultAbortDecided)
	for _, g := range gone {
		s.removeBranchLayer(ctx, mounts, r.id(), g)
	}
	s.removeCheckpointOrphans(ctx, r.id())
	s.fault(FaultAbortRemoved)
	log.G(ctx).WithFields(log.Fields{"root": r.key, "aborted": gone}).Info("aborted")
	return gone, nil
}

// unsealIdle makes writable again every context of r that was sealed by a
// fork and has no live children left.
func (s *Snapshotter) unsealIdle(ctx context.Context, r rootSnap) error {
	idle := false
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		t, err := loadTree(tx, r.id())
		if err != nil || t == nil {
			return err
		}
		for id, n := range t.Nodes {
			idle = idle || (n.SealedByUs && !t.Sealed(id))
		}
		return nil
	}); err != nil || !idle {
		return err
	}
	mounts, err := readOverlayMounts()
	if err != nil {
		return err
	}
	return s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		t, err := loadTree(tx, r.id())
		if err != nil || t == nil {
			return err
		}
		changed := false
		for id, n := range t.Nodes {
			if !n.SealedByUs || t.Sealed(id) {
				continue
			}
			if err := s.setSealed(ctx, mounts, s.contextUpper(r.id(), id), n, false); err != nil {
				return err
			}
			clearSeal(n)
			changed = true
		}
		if !changed {
			return nil
		}
		return storeTree(tx, r.id(), t)
	})
}

// Tree returns the branch tree of a root snapshot: every context still
// known, with its state, epoch, upper size and age.
func (s *Snapshotter) Tree(ctx context.Context, root Root) (TreeInfo, error) {
	var (
		r     rootSnap
		tree  *branch.Tree
		ended []branch.Node
		cause error
	)
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if r, _, err = s.resolve(ctx, Context{Root: root}); err != nil {
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
		out.Nodes = append(out.Nodes, BranchInfo{Node: n})
	}
	sort.SliceStable(out.Nodes, func(i, j int) bool { return numLess(out.Nodes[i].ID, out.Nodes[j].ID) })
	return out, nil
}

// BranchMounts returns the mounts of a context. A sealed context's mounts
// are read-only: its layer is its children's lower.
func (s *Snapshotter) BranchMounts(ctx context.Context, c Context) ([]mount.Mount, error) {
	var out []mount.Mount
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
			return err
		}
		out = s.contextMounts(r, tree, id, tree.Sealed(id))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("mounts of %s: %w", c, err)
	}
	return out, nil
}

func (s *Snapshotter) describe(ctx context.Context, r rootSnap, tree *branch.Tree, id string, usage bool) BranchInfo {
	n := tree.Nodes[id]
	info := BranchInfo{Node: *n, Sealed: tree.Sealed(id), Children: tree.Children(id)}
	if n.State == branch.Live || n.State == branch.Committing {
		if usage {
			if du, err := fs.DiskUsage(ctx, s.contextUpper(r.id(), id)); err == nil {
				info.UpperSize, info.UpperInodes = du.Size, du.Inodes
			}
		}
		if n.State == branch.Live {
			info.Mounts = s.contextMounts(r, tree, id, info.Sealed)
		}
	}
	return info
}

// removeBranchLayer detaches every host mount of a branch's layer and
// removes its directory. Failures are logged: Cleanup removes whatever a
// branch no longer owns.
func (s *Snapshotter) removeBranchLayer(ctx context.Context, mounts mountTable, rootID, id string) {
	dir := s.branchDir(rootID, id)
	mounts.detach(ctx, filepath.Join(dir, "fs"))
	s.discard(ctx, dir)
}

// overlayMountsOrNone reads the overlay mounts; on failure it logs and
// returns none, so that removals go on (Cleanup detaches what they miss).
func overlayMountsOrNone(ctx context.Context) mountTable {
	t, err := readOverlayMounts()
	if err != nil {
		log.G(ctx).WithError(err).Warn("read mounts")
	}
	return t
}

// setSealed seals or unseals the context n (whose upper is upper) the way
// its seal was made: its superblock, each recorded mount, or nothing (the
// caller's seal: its processes were frozen).
func (s *Snapshotter) setSealed(ctx context.Context, mounts mountTable, upper string, n *branch.Node, sealed bool) error {
	switch n.SealMode {
	case branch.SealCaller:
		return nil
	case branch.SealMounts:
		return setEachRecorded(ctx, n.SealedMounts, upper, sealed)
	}
	live := mounts.live(upper)
	if live.target == "" || live.readonly == sealed {
		return nil
	}
	if err := remountLive(live, sealed); err != nil {
		return err
	}
	log.G(ctx).WithFields(log.Fields{"mount": live.target, "sealed": sealed}).Debug("seal changed")
	return nil
}

func makeBranchDir(dir string, uid, gid int) error {
	// The root's branches directory exists after its first fork: try the
	// one mkdir before MkdirAll's walk.
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create branch directory: %w", err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "fs"), 0o755); err != nil {
		return fmt.Errorf("create branch layer: %w", err)
	}
	if err := os.Lchown(filepath.Join(dir, "fs"), uid, gid); err != nil {
		return fmt.Errorf("chown branch layer: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "work"), 0o711); err != nil {
		return fmt.Errorf("create branch work directory: %w", err)
	}
	return nil
}

// recoverBranches finishes what a crash interrupted: commits that were
// decided are carried through, and every sealed context is made to match
// its children again. Orphaned layers go with Cleanup. A tree whose
// recovery fails is quarantined (quarantine.go), not the daemon's end.
func (s *Snapshotter) recoverBranches(ctx context.Context) error {
	var (
		trees map[string]*branch.Tree
		bad   map[string]error
	)
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		trees, bad, err = allTrees(tx)
		return err
	}); err != nil {
		return err
	}
	for rootID, err := range bad {
		s.quarantineTree(ctx, rootID, "snapshot "+rootID, err)
	}
	for rootID, t := range trees {
		if err := s.recoverTree(ctx, rootID, t); err != nil {
			s.quarantineTree(ctx, rootID, t.Root, err)
		}
	}
	return nil
}

// recoverTree completes the commits of tree t (of root snapshot rootID)
// that were decided, and reseals its contexts; a tree whose root snapshot
// is gone is deleted.
func (s *Snapshotter) recoverTree(ctx context.Context, rootID string, t *branch.Tree) error {
	var r rootSnap
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		r, _, err = s.resolve(ctx, Context{Root: Root{Key: t.Root}})
		return err
	})
	if (err != nil && errdefs.IsNotFound(err)) || (err == nil && r.id() != rootID) {
		log.G(ctx).WithError(err).WithField("root", t.Root).Warn("branch tree without its root snapshot; removing it")
		return s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error { return deleteTree(tx, rootID) })
	}
	if err != nil {
		return fmt.Errorf("find root snapshot %q: %w", t.Root, err)
	}
	defer s.locks.lock(r.id())()
	for _, id := range t.Committing() {
		log.G(ctx).WithFields(log.Fields{"root": t.Root, "branch": id}).Info("completing a commit interrupted by a crash")
		if _, err := s.finishCommit(ctx, r, id, true, nil, nil); err != nil {
			return fmt.Errorf("complete the commit of branch %s: %w", id, err)
		}
	}
	if err := s.resealAll(ctx, r); err != nil {
		return fmt.Errorf("reseal its contexts: %w", err)
	}
	return nil
}

// resealAll makes every context of r that a fork sealed match its
// children again: read-only while it has some, writable once it has none.
func (s *Snapshotter) resealAll(ctx context.Context, r rootSnap) error {
	var t *branch.Tree
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		t, err = loadTree(tx, r.id())
		return err
	}); err != nil || t == nil {
		return err
	}
	mounts, err := readOverlayMounts()
	if err != nil {
		return err
	}
	for id, n := range t.Nodes {
		if n.SealedByUs && t.Sealed(id) {
			err := s.setSealed(ctx, mounts, s.contextUpper(r.id(), id), n, true)
			if errors.Is(err, errSuperblockBusy) {
				err = s.sealEachMount(ctx, r, id, contextName(id)+" of "+t.Root)
			}
			if err != nil {
				return err
			}
		}
	}
	return s.unsealIdle(ctx, r)
}

// orphanBranchDirectories lists branch layers that no tree owns, and
// temporary commit mounts left by a crash.
func (s *Snapshotter) orphanBranchDirectories(ctx context.Context, tx *bolt.Tx, ids map[string]string) ([]string, error) {
	trees, bad, err := allTrees(tx)
	if err != nil {
		return nil, err
	}
	var orphans []string
	base := filepath.Join(s.root, "branches")
	roots, err := os.ReadDir(base)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, rd := range roots {
		if bad[rd.Name()] != nil {
			continue // quarantined: its layers are all there is to recover it from
		}
		t, ok := trees[rd.Name()]
		if _, live := ids[rd.Name()]; !ok || !live {
			orphans = append(orphans, filepath.Join(base, rd.Name()))
			continue
		}
		layered := map[string]bool{}
		for _, id := range t.Layered() {
			layered[id] = true
		}
		entries, err := os.ReadDir(filepath.Join(base, rd.Name()))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if !layered[e.Name()] {
				orphans = append(orphans, filepath.Join(base, rd.Name(), e.Name()))
			}
		}
	}
	for _, o := range orphans {
		detachMountsUsing(ctx, o)
	}
	return orphans, nil
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

// cleanTempMounts unmounts and removes the temporary commit mounts a crash
// left behind. Only at start: while serving, a commit may be using one.
func (s *Snapshotter) cleanTempMounts(ctx context.Context) error {
	mnt := filepath.Join(s.root, "mnt")
	entries, err := os.ReadDir(mnt)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(mnt, e.Name())
		if err := mount.UnmountAll(p, 0); err != nil {
			return fmt.Errorf("unmount leftover commit mount %s: %w", p, err)
		}
		if err := os.RemoveAll(p); err != nil {
			return err
		}
		log.G(ctx).WithField("path", p).Info("removed leftover commit mount")
	}
	return nil
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

func (c Context) String() string {
	where := c.Root.String()
	if c.Branch == "" || c.Branch == branch.RootID {
		if c.Root.Key != "" {
			return "root snapshot " + where
		}
		return where
	}
	if c.Root.Key == "" {
		where = "the sandbox"
	}
	return "branch " + strconv.Quote(c.Branch) + " of " + where
}

func getSnapshot(ctx context.Context, key string) (storage.Snapshot, error) {
	return storage.GetSnapshot(ctx, key)
}
