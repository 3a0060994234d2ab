//go:build linux

package snapshotter

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/apply"
	"github.com/branchbox/branchbox/snapshotter/layer"
)

// Checkpoints are immutable layers beside the branches:
//
//	<root>/checkpoints/<root snapshot id>/<seq>/fs        the layer
//	<root>/checkpoints/<root snapshot id>/<seq>/manifest  the context's upper as it was
//	<root>/checkpoints/<root snapshot id>/new-<seq>       a layer being written
//	<root>/checkpoints/<root snapshot id>/rb-<context>    a rollback's scratch layer
//	<root>/mnt/ck-<root snapshot id>-<seq>                a checkpoint's state, mounted
//
// Checkpoint k of a context holds what changed in the context's upper since
// the checkpoint it last took or rolled back to (its parent), found by
// comparing the upper with the parent's manifest (inode and ctime of every
// entry of the upper): its state is layer k over its parent's layers over
// the context's own lowers. So taking one costs a stat per entry of the
// upper plus a copy of what changed, never a walk of the image's layers.
// Rollback finds what changed since the checkpoint the same way, writes the
// checkpoint's version of just those paths into a scratch layer, and applies
// it through the context's live mount like a commit.
//
// The records live in the metadata database, one JSON document per root
// snapshot, so a checkpoint exists exactly when its record does: a layer
// without one is an orphan that Cleanup removes. A deleted checkpoint whose
// layer a remaining one's chain still needs keeps its record among the
// document's Deleted ones, out of reach by name, until the last checkpoint
// that needs it goes.

const (
	bucketCheckpoints = "checkpoints" // root snapshot id -> JSON checkpointDoc
	// maxChain bounds a chain of checkpoint layers (each is one more overlay
	// lower); the next checkpoint after that many is a full copy of the upper.
	maxChain = 64
)

// Fault points of checkpoint and rollback.
const (
	FaultCheckpointWritten  = "checkpoint:layer-written"
	FaultCheckpointRecorded = "checkpoint:recorded"
	FaultCheckpointDeleted  = "checkpoint:deleted"
	FaultRollbackDecided    = "rollback:decided"
	FaultRollbackApplied    = "rollback:applied"
	FaultRollbackFinished   = "rollback:finished"
)

type checkpointRecord struct {
	Name    string    `json:"name"`
	Context string    `json:"context"`
	Parent  string    `json:"parent,omitempty"`
	Seq     uint64    `json:"seq"`
	Created time.Time `json:"created"`
	Size    int64     `json:"size"`
	Entries int64     `json:"entries"`
	// Chain is this layer's sequence number and its parents', newest first.
	Chain []uint64 `json:"chain"`
}

// deletedParent is what a checkpoint reports as its parent once that was
// deleted: not a valid name, so never taken for a later checkpoint that
// reuses the old one.
const deletedParent = "(deleted)"

type checkpointDoc struct {
	Next        uint64                       `json:"next"`
	Checkpoints map[string]*checkpointRecord `json:"checkpoints"`
	// Deleted holds, by sequence number, the records of deleted checkpoints
	// whose layers remaining checkpoints' chains still stack. They have no
	// name: nothing looks them up but garbage collection and Cleanup.
	Deleted map[uint64]*checkpointRecord `json:"deleted,omitempty"`
	// Heads maps a context to the checkpoint it last took or rolled back
	// to: the base of its next checkpoint.
	Heads map[string]string `json:"heads"`
	// Pending maps a context to the checkpoint a decided rollback is
	// bringing it back to; recovery completes it.
	Pending map[string]string `json:"pending"`
}

func loadCheckpoints(tx *bolt.Tx, rootID string) (*checkpointDoc, error) {
	d := &checkpointDoc{Next: 1, Checkpoints: map[string]*checkpointRecord{}, Deleted: map[uint64]*checkpointRecord{}, Heads: map[string]string{}, Pending: map[string]string{}}
	b := nestedBucket(tx, bucketBranchbox, bucketCheckpoints)
	if b == nil {
		return d, nil
	}
	v := b.Get([]byte(rootID))
	if v == nil {
		return d, nil
	}
	if err := json.Unmarshal(v, d); err != nil {
		return nil, fmt.Errorf("decode checkpoints of snapshot %s: %v: %w", rootID, err, errdefs.ErrDataLoss)
	}
	if d.Checkpoints == nil {
		d.Checkpoints = map[string]*checkpointRecord{}
	}
	if d.Heads == nil {
		d.Heads = map[string]string{}
	}
	if d.Pending == nil {
		d.Pending = map[string]string{}
	}
	if d.Deleted == nil {
		d.Deleted = map[uint64]*checkpointRecord{}
	}
	return d, nil
}

// needed is the set of layers the checkpoints' chains stack.
func (d *checkpointDoc) needed() map[uint64]bool {
	out := map[uint64]bool{}
	for _, c := range d.Checkpoints {
		for _, seq := range c.Chain {
			out[seq] = true
		}
	}
	return out
}

// collect drops the deleted records no checkpoint's chain needs any more
// and returns their sequence numbers: their layers are then orphans.
func (d *checkpointDoc) collect() []uint64 {
	needed := d.needed()
	var gone []uint64
	for seq := range d.Deleted {
		if !needed[seq] {
			delete(d.Deleted, seq)
			gone = append(gone, seq)
		}
	}
	return gone
}

func storeCheckpoints(tx *bolt.Tx, rootID string, d *checkpointDoc) error {
	b, err := tx.CreateBucketIfNotExists([]byte(bucketBranchbox))
	if err != nil {
		return err
	}
	cb, err := b.CreateBucketIfNotExists([]byte(bucketCheckpoints))
	if err != nil {
		return err
	}
	v, err := json.Marshal(d)
	if err != nil {
		return err
	}
	return cb.Put([]byte(rootID), v)
}

func deleteCheckpoints(tx *bolt.Tx, rootID string) error {
	if b := nestedBucket(tx, bucketBranchbox, bucketCheckpoints); b != nil {
		return b.Delete([]byte(rootID))
	}
	return nil
}

// pruneCheckpoints drops the records of checkpoints whose context no longer
// has a layer, and the deleted ones only those stacked; their directories
// become orphans. storeTree calls it, so a context's checkpoints end in the
// transaction that ends it.
func pruneCheckpoints(tx *bolt.Tx, rootID string, t *branch.Tree) error {
	d, err := loadCheckpoints(tx, rootID)
	if err != nil || len(d.Checkpoints) == 0 && len(d.Heads) == 0 && len(d.Deleted) == 0 {
		return err
	}
	changed := false
	for name, c := range d.Checkpoints {
		if _, ok := t.Nodes[c.Context]; !ok {
			delete(d.Checkpoints, name)
			changed = true
		}
	}
	for id := range d.Heads {
		if _, ok := t.Nodes[id]; !ok {
			delete(d.Heads, id)
			delete(d.Pending, id)
			changed = true
		}
	}
	if len(d.collect()) > 0 {
		changed = true
	}
	if !changed {
		return nil
	}
	return storeCheckpoints(tx, rootID, d)
}

func (s *Snapshotter) checkpointBase(rootID string) string {
	return filepath.Join(s.root, "checkpoints", rootID)
}

func (s *Snapshotter) checkpointDir(rootID string, seq uint64) string {
	return filepath.Join(s.checkpointBase(rootID), strconv.FormatUint(seq, 10))
}

// lowerDirs is the lower stack of a context, top first: a branch's
// parent's upper (or, forked from a checkpoint, that checkpoint's layers)
// over its parent's lowers; the root snapshot's own parent layers.
func (s *Snapshotter) lowerDirs(r rootSnap, t *branch.Tree, id string) []string {
	var out []string
	for n := t.Nodes[id]; n != nil && n.ID != branch.RootID; n = t.Nodes[n.Parent] {
		if len(n.CheckpointLayers) > 0 {
			for _, seq := range n.CheckpointLayers {
				out = append(out, filepath.Join(s.checkpointDir(r.id(), seq), "fs"))
			}
		} else {
			out = append(out, s.contextUpper(r.id(), n.Parent))
		}
	}
	for _, p := range r.snap.ParentIDs {
		out = append(out, s.upperPath(p))
	}
	return out
}

// validCheckpointName keeps names usable as command-line words and in
// messages.
func validCheckpointName(name string) error {
	if name == "" || len(name) > 128 || name[0] == '.' || name[0] == '-' {
		return fmt.Errorf("checkpoint name %q must be 1 to 128 characters, not starting with '.' or '-': %w", name, errdefs.ErrInvalidArgument)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '@' || c == ':') {
			return fmt.Errorf("checkpoint name %q may hold only letters, digits and . _ - @ :: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// lockedContext resolves c, locks its root and returns what the operation
// needs; the caller must call unlock.
func (s *Snapshotter) lockContext(ctx context.Context, c Context) (r rootSnap, id string, unlock func(), err error) {
	if err := s.withTx(ctx, false, func(ctx context.Context, _ *bolt.Tx) (err error) {
		r, id, err = s.resolve(ctx, c)
		return err
	}); err != nil {
		return r, id, nil, err
	}
	if err := s.usable(r); err != nil {
		return r, id, nil, err
	}
	return r, id, s.locks.lock(r.id()), nil
}

// Checkpoint records the current state of context c's rootfs under name
// (unique among the checkpoints of its root). A running context is read as
// it is: a file written during the checkpoint is taken as the copy found
// it, as cp would.
func (s *Snapshotter) Checkpoint(ctx context.Context, c Context, name string) (_ branch.Checkpoint, retErr error) {
	if err := validCheckpointName(name); err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
	}
	r, id, unlock, err := s.lockContext(ctx, c)
	if err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
	}
	defer unlock()
	var (
		prev   layer.Manifest
		parent *checkpointRecord
		seq    uint64
	)
	err = s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		tree, d, err := s.loadBoth(tx, r)
		if err != nil {
			return err
		}
		if _, err := tree.Get(id); err != nil {
			return err
		}
		if id == branch.RootID && len(r.snap.ParentIDs) == 0 {
			return fmt.Errorf("%s has no parent layers (a bind mount, not an overlay): %w", c, errdefs.ErrNotImplemented)
		}
		if _, ok := d.Checkpoints[name]; ok {
			return fmt.Errorf("a checkpoint named %q already exists in %s: %w", name, branch.DisplayKey(r.key), errdefs.ErrAlreadyExists)
		}
		if p := d.Checkpoints[d.Heads[id]]; p != nil && len(p.Chain) < maxChain {
			parent = p
		}
		seq = d.Next
		return nil
	})
	if err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint %s as %q: %w", c, name, err)
	}
	if parent != nil {
		if prev, err = layer.LoadManifest(filepath.Join(s.checkpointDir(r.id(), parent.Seq), "manifest")); err != nil {
			return branch.Checkpoint{}, fmt.Errorf("checkpoint %s as %q: base %q: %w", c, name, parent.Name, err)
		}
	}
	upper := s.contextUpper(r.id(), id)
	changes, cur, err := layer.Diff(ctx, upper, prev)
	if err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint %s as %q: find changes: %w", c, name, err)
	}
	tmp := filepath.Join(s.checkpointBase(r.id()), "new-"+strconv.FormatUint(seq, 10))
	final := s.checkpointDir(r.id(), seq)
	defer func() {
		if retErr != nil {
			os.RemoveAll(tmp)
			os.RemoveAll(final)
		}
	}()
	// Leftovers of an attempt that failed under this number.
	os.RemoveAll(tmp)
	os.RemoveAll(final)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
	}
	if err := os.Mkdir(filepath.Join(tmp, "fs"), 0o755); err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
	}
	st, err := layer.Write(ctx, layer.Source{Root: upper}, changes, filepath.Join(tmp, "fs"))
	if err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint %s as %q: copy changes: %w", c, name, err)
	}
	if err := layer.SaveManifest(filepath.Join(tmp, "manifest"), cur); err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint %s as %q: %w", c, name, err)
	}
	s.fault(FaultCheckpointWritten)
	if err := os.Rename(tmp, final); err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint: move layer into place: %w", err)
	}
	rec := &checkpointRecord{Name: name, Context: id, Seq: seq, Created: time.Now(), Size: st.Bytes, Entries: st.Entries, Chain: []uint64{seq}}
	if parent != nil {
		rec.Parent = parent.Name
		rec.Chain = append(rec.Chain, parent.Chain...)
	}
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		tree, d, err := s.loadBoth(tx, r)
		if err != nil {
			return err
		}
		if _, err := tree.Get(id); err != nil {
			return err
		}
		if _, ok := d.Checkpoints[name]; ok || d.Next != seq {
			return fmt.Errorf("checkpoints of %s changed meanwhile: %w", branch.DisplayKey(r.key), errdefs.ErrAborted)
		}
		d.Checkpoints[name] = rec
		d.Heads[id] = name
		d.Next++
		return storeCheckpoints(tx, r.id(), d)
	})
	if err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint %s as %q: %w", c, name, err)
	}
	s.fault(FaultCheckpointRecorded)
	log.G(ctx).WithFields(log.Fields{"root": r.key, "context": id, "name": name, "changes": len(changes), "bytes": st.Bytes}).Info("checkpoint")
	return branch.Checkpoint{Name: name, Context: id, Parent: rec.Parent, Created: rec.Created, Size: rec.Size, Entries: rec.Entries, Depth: len(rec.Chain), Head: true}, nil
}

// loadBoth reads the branch tree (a new one if none) and the checkpoints of r.
func (s *Snapshotter) loadBoth(tx *bolt.Tx, r rootSnap) (*branch.Tree, *checkpointDoc, error) {
	tree, err := loadTree(tx, r.id())
	if err != nil {
		return nil, nil, err
	}
	if tree == nil {
		tree = branch.NewTree(r.key, time.Now())
	}
	d, err := loadCheckpoints(tx, r.id())
	return tree, d, err
}

// Checkpoints lists the checkpoints of a root snapshot's contexts, oldest
// first.
func (s *Snapshotter) Checkpoints(ctx context.Context, root Root) ([]branch.Checkpoint, error) {
	var out []branch.Checkpoint
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		r, _, err := s.resolve(ctx, Context{Root: root})
		if err != nil {
			return err
		}
		tree, d, err := s.loadBoth(tx, r)
		if err != nil {
			return err
		}
		recs := make([]*checkpointRecord, 0, len(d.Checkpoints))
		for _, c := range d.Checkpoints {
			recs = append(recs, c)
		}
		sort.Slice(recs, func(i, j int) bool { return recs[i].Seq < recs[j].Seq })
		for _, c := range recs {
			out = append(out, describeCheckpoint(tree, d, c))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	return out, nil
}

func describeCheckpoint(t *branch.Tree, d *checkpointDoc, c *checkpointRecord) branch.Checkpoint {
	info := branch.Checkpoint{Name: c.Name, Context: c.Context, Parent: c.Parent, Created: c.Created, Size: c.Size, Entries: c.Entries, Depth: len(c.Chain), Head: d.Heads[c.Context] == c.Name}
	for _, o := range d.Checkpoints {
		if o.Parent == c.Name {
			info.Children = append(info.Children, o.Name)
		}
	}
	sort.Strings(info.Children)
	for id, n := range t.Nodes {
		if n.FromCheckpoint == c.Name {
			info.Branches = append(info.Branches, id)
		}
	}
	sortNumeric(info.Branches)
	return info
}

// DeleteCheckpoint removes a checkpoint: its name is free at once. It is
// refused while a live branch is forked from it or a rollback to it is under
// way. Checkpoints built on it keep its layer (their chains stack it) until
// the last of them is deleted or ends.
func (s *Snapshotter) DeleteCheckpoint(ctx context.Context, root Root, name string) error {
	r, _, unlock, err := s.lockContext(ctx, Context{Root: root})
	if err != nil {
		return fmt.Errorf("delete checkpoint %q: %w", name, err)
	}
	defer unlock()
	var gone []uint64
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		tree, d, err := s.loadBoth(tx, r)
		if err != nil {
			return err
		}
		c := d.Checkpoints[name]
		if c == nil {
			return fmt.Errorf("no checkpoint named %q in %s: %w", name, branch.DisplayKey(r.key), errdefs.ErrNotFound)
		}
		if info := describeCheckpoint(tree, d, c); len(info.Branches) > 0 {
			return fmt.Errorf("branches %s are built on it; commit or abort them first: %w", strings.Join(info.Branches, ", "), errdefs.ErrFailedPrecondition)
		}
		for id, p := range d.Pending {
			if p == name {
				return fmt.Errorf("a rollback of context %s to it is under way: %w", id, errdefs.ErrFailedPrecondition)
			}
		}
		delete(d.Checkpoints, name)
		if d.Heads[c.Context] == name {
			// The context's next checkpoint is a full one.
			delete(d.Heads, c.Context)
		}
		for _, o := range d.Checkpoints {
			if o.Parent == name {
				o.Parent = deletedParent
			}
		}
		// Kept nameless for now; collect drops it (and any deleted record
		// only it needed) unless a remaining chain stacks it.
		d.Deleted[c.Seq] = c
		gone = d.collect()
		return storeCheckpoints(tx, r.id(), d)
	})
	if err != nil {
		return fmt.Errorf("delete checkpoint %q: %w", name, err)
	}
	s.fault(FaultCheckpointDeleted)
	// A crash before this leaves orphans that start-up's Cleanup removes.
	for _, seq := range gone {
		if err := os.RemoveAll(s.checkpointDir(r.id(), seq)); err != nil {
			log.G(ctx).WithError(err).WithField("checkpoint", name).Warn("remove checkpoint layer; Cleanup will retry")
		}
	}
	log.G(ctx).WithFields(log.Fields{"root": r.key, "name": name, "layers removed": len(gone)}).Info("checkpoint deleted")
	return nil
}

// Rollback brings context c's rootfs back to checkpoint name, through its
// live mount if it has one, so its running processes see it at once. It is
// refused while c has live children (their lowers are c's upper). The
// decision is recorded first; a crash after it is completed on restart.
func (s *Snapshotter) Rollback(ctx context.Context, c Context, name string) error {
	r, id, unlock, err := s.lockContext(ctx, c)
	if err != nil {
		return fmt.Errorf("rollback: %w", err)
	}
	defer unlock()
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		tree, d, err := s.loadBoth(tx, r)
		if err != nil {
			return err
		}
		if _, err := tree.Get(id); err != nil {
			return err
		}
		if kids := tree.Children(id); len(kids) > 0 {
			return fmt.Errorf("it has %d live children (%s) built on its current state; commit or abort them first: %w", len(kids), strings.Join(kids, ", "), errdefs.ErrFailedPrecondition)
		}
		ck := d.Checkpoints[name]
		if ck == nil {
			return fmt.Errorf("no checkpoint named %q in %s: %w", name, branch.DisplayKey(r.key), errdefs.ErrNotFound)
		}
		if ck.Context != id {
			return fmt.Errorf("checkpoint %q is of context %s, not of this one: %w", name, ck.Context, errdefs.ErrInvalidArgument)
		}
		if p, ok := d.Pending[id]; ok && p != name {
			return fmt.Errorf("a rollback to %q is under way; call rollback to %q again to complete it: %w", p, p, errdefs.ErrFailedPrecondition)
		}
		d.Pending[id] = name
		return storeCheckpoints(tx, r.id(), d)
	})
	if err != nil {
		return fmt.Errorf("rollback %s to %q: %w", c, name, err)
	}
	// As a commit's: the decision outlives a power loss before the context
	// changes, so a half-done rollback is completed (branchdb.go).
	if err := s.bdb.Sync(); err != nil {
		return fmt.Errorf("rollback %s to %q (decided; calling rollback again completes it): sync branch metadata: %w", c, name, err)
	}
	s.fault(FaultRollbackDecided)
	// Decided: carried through even if the caller goes away (a shim
	// killed, a client that gave up), or the context would stay pending,
	// its checkpoint undeletable, until a restart.
	if err := s.finishRollback(context.WithoutCancel(ctx), r, id, name); err != nil {
		return fmt.Errorf("rollback %s to %q (decided; calling rollback again, or a restart, completes it): %w", c, name, err)
	}
	return nil
}

// finishRollback carries a decided rollback through. It is idempotent:
// what differs from the checkpoint is found afresh each time.
func (s *Snapshotter) finishRollback(ctx context.Context, r rootSnap, id, name string) error {
	var (
		tree *branch.Tree
		ck   *checkpointRecord
	)
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		t, d, err := s.loadBoth(tx, r)
		tree, ck = t, d.Checkpoints[name]
		return err
	}); err != nil {
		return err
	}
	if ck == nil {
		return fmt.Errorf("checkpoint %q is gone: %w", name, errdefs.ErrNotFound)
	}
	if err := s.withContextTarget(ctx, r, tree, id, func(target string) error {
		return s.rollbackThrough(ctx, r, tree, id, ck, target, nil)
	}); err != nil {
		return err
	}
	s.fault(FaultRollbackApplied)
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		d, err := loadCheckpoints(tx, r.id())
		if err != nil {
			return err
		}
		delete(d.Pending, id)
		d.Heads[id] = name
		return storeCheckpoints(tx, r.id(), d)
	})
	if err != nil {
		return err
	}
	s.fault(FaultRollbackFinished)
	log.G(ctx).WithFields(log.Fields{"root": r.key, "context": id, "checkpoint": name}).Info("rolled back")
	return nil
}

// withContextTarget calls fn with a writable merged view of context id:
// its live mount (made writable for the duration if a seal left it
// read-only), or a temporary mount.
func (s *Snapshotter) withContextTarget(ctx context.Context, r rootSnap, tree *branch.Tree, id string, fn func(target string) error) error {
	live, err := s.live.find(s.contextUpper(r.id(), id))
	if err != nil {
		return err
	}
	if live.target == "" {
		target := filepath.Join(s.root, "mnt", r.id()+"-"+id)
		if err := os.MkdirAll(target, 0o700); err != nil {
			return err
		}
		defer os.Remove(target)
		if err := mount.All(s.contextMounts(r, tree, id, false), target); err != nil {
			return fmt.Errorf("mount context %s: %w", id, err)
		}
		defer func() {
			if err := mount.UnmountAll(target, 0); err != nil {
				log.G(ctx).WithError(err).WithField("mount", target).Warn("unmount temporary mount")
			}
		}()
		return fn(target)
	}
	if live.readonly {
		return fmt.Errorf("context %s is mounted read-only at %s: %w", id, live.target, errdefs.ErrFailedPrecondition)
	}
	return fn(live.target)
}

// rollbackThrough makes target (a merged view of context id) show
// checkpoint ck: the paths of the upper that changed since ck are written
// as ck has them into a scratch layer, applied to target. j, if not nil,
// records what that changes in the context's upper.
func (s *Snapshotter) rollbackThrough(ctx context.Context, r rootSnap, tree *branch.Tree, id string, ck *checkpointRecord, target string, j *apply.Journal) (retErr error) {
	m, err := layer.LoadManifest(filepath.Join(s.checkpointDir(r.id(), ck.Seq), "manifest"))
	if err != nil {
		return err
	}
	changes, _, err := layer.Diff(ctx, s.contextUpper(r.id(), id), m)
	if err != nil {
		return fmt.Errorf("find changes since checkpoint %q: %w", ck.Name, err)
	}
	if len(changes) == 0 {
		return nil
	}
	// The checkpoint's state, read-only: its layers over the context's lowers.
	state := filepath.Join(s.root, "mnt", "ck-"+r.id()+"-"+strconv.FormatUint(ck.Seq, 10))
	lowers := make([]string, 0, len(ck.Chain)+8)
	for _, seq := range ck.Chain {
		lowers = append(lowers, filepath.Join(s.checkpointDir(r.id(), seq), "fs"))
	}
	lowers = append(lowers, s.lowerDirs(r, tree, id)...)
	if err := os.MkdirAll(state, 0o700); err != nil {
		return err
	}
	defer os.Remove(state)
	opts := append([]string{"ro", "lowerdir=" + strings.Join(lowers, ":")}, s.options...)
	if err := mount.All([]mount.Mount{{Type: "overlay", Source: "overlay", Options: opts}}, state); err != nil {
		return fmt.Errorf("mount checkpoint %q: %w", ck.Name, err)
	}
	defer func() {
		if err := mount.UnmountAll(state, 0); err != nil && retErr == nil {
			retErr = fmt.Errorf("unmount checkpoint %q: %w", ck.Name, err)
		}
	}()
	scratch := filepath.Join(s.checkpointBase(r.id()), "rb-"+id)
	os.RemoveAll(scratch)
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	if _, err := layer.Write(ctx, layer.Source{Root: state, Merged: true}, changes, scratch); err != nil {
		return fmt.Errorf("gather checkpoint %q's version of %d changed paths: %w", ck.Name, len(changes), err)
	}
	// resume: a killed apply's temporaries in target are removed.
	if err := applyLayer(ctx, scratch, target, "", true, j); err != nil {
		return fmt.Errorf("apply checkpoint %q through %s: %w", ck.Name, target, err)
	}
	return nil
}

// recoverCheckpoints completes the rollbacks a crash interrupted.
func (s *Snapshotter) recoverCheckpoints(ctx context.Context) error {
	todo, err := s.pendingRollbacks(ctx, "")
	if err != nil {
		return err
	}
	for _, p := range todo {
		if s.quarantined.cause(p.rootID) != nil {
			continue // retried with the rest of its tree
		}
		if err := s.finishPendingRollback(ctx, p); err != nil {
			s.quarantineTree(ctx, p.rootID, "snapshot "+p.rootID, err)
		}
	}
	return nil
}

// pendingRollback is a rollback that was decided and not finished.
type pendingRollback struct{ rootID, ctxID, name string }

// pendingRollbacks lists the unfinished rollbacks of root snapshot rootID,
// or of every root if rootID is "". A root whose checkpoint record cannot
// be decoded is quarantined.
func (s *Snapshotter) pendingRollbacks(ctx context.Context, rootID string) ([]pendingRollback, error) {
	var todo []pendingRollback
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		b := nestedBucket(tx, bucketBranchbox, bucketCheckpoints)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			if rootID != "" && string(k) != rootID {
				return nil
			}
			var d checkpointDoc
			if err := json.Unmarshal(v, &d); err != nil {
				err = fmt.Errorf("decode checkpoints of snapshot %s: %v: %w", k, err, errdefs.ErrDataLoss)
				if rootID != "" {
					return err
				}
				s.quarantineTree(ctx, string(k), "snapshot "+string(k), err)
				return nil
			}
			for id, name := range d.Pending {
				todo = append(todo, pendingRollback{string(k), id, name})
			}
			return nil
		})
	})
	return todo, err
}

// finishPendingRollback completes a rollback a crash interrupted.
func (s *Snapshotter) finishPendingRollback(ctx context.Context, p pendingRollback) error {
	var r rootSnap
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		ids, err := storage.IDMap(ctx)
		if err != nil {
			return err
		}
		key, ok := ids[p.rootID]
		if !ok {
			return fmt.Errorf("snapshot %s: %w", p.rootID, errdefs.ErrNotFound)
		}
		r, _, err = s.resolve(ctx, Context{Root: Root{Key: key}})
		return err
	})
	if err != nil {
		log.G(ctx).WithError(err).WithField("snapshot", p.rootID).Warn("rollback pending for a snapshot that is gone")
		return nil
	}
	log.G(ctx).WithFields(log.Fields{"root": r.key, "context": p.ctxID, "checkpoint": p.name}).Info("completing a rollback interrupted by a crash")
	unlock := s.locks.lock(r.id())
	err = s.finishRollback(ctx, r, p.ctxID, p.name)
	unlock()
	if err != nil {
		return fmt.Errorf("complete the rollback of context %s to %q: %w", p.ctxID, p.name, err)
	}
	return nil
}

// orphanCheckpointDirectories lists checkpoint layers no record owns. The
// temporaries of operations in flight (new-*, rb-*) are left alone; the
// start of the daemon removes them (removeCheckpointTemps).
func (s *Snapshotter) orphanCheckpointDirectories(tx *bolt.Tx, ids map[string]string) ([]string, error) {
	base := filepath.Join(s.root, "checkpoints")
	roots, err := os.ReadDir(base)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	var orphans []string
	for _, rd := range roots {
		if _, live := ids[rd.Name()]; !live {
			orphans = append(orphans, filepath.Join(base, rd.Name()))
			continue
		}
		more, err := s.orphanCheckpointsOf(tx, rd.Name())
		if err != nil {
			return nil, err
		}
		orphans = append(orphans, more...)
	}
	return orphans, nil
}

func (s *Snapshotter) orphanCheckpointsOf(tx *bolt.Tx, rootID string) ([]string, error) {
	d, err := loadCheckpoints(tx, rootID)
	if err != nil {
		return nil, err
	}
	// Every layer a record's chain stacks is owned, deleted records' too.
	owned := map[string]bool{}
	own := func(c *checkpointRecord) {
		owned[strconv.FormatUint(c.Seq, 10)] = true
		for _, seq := range c.Chain {
			owned[strconv.FormatUint(seq, 10)] = true
		}
	}
	for _, c := range d.Checkpoints {
		own(c)
	}
	for _, c := range d.Deleted {
		own(c)
	}
	entries, err := os.ReadDir(s.checkpointBase(rootID))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !owned[e.Name()] && !strings.HasPrefix(e.Name(), "new-") && !strings.HasPrefix(e.Name(), "rb-") {
			out = append(out, filepath.Join(s.checkpointBase(rootID), e.Name()))
		}
	}
	return out, nil
}

// removeCheckpointOrphans removes the layers of checkpoints whose context
// ended. Called with the root's lock held, so no checkpoint is in flight.
func (s *Snapshotter) removeCheckpointOrphans(ctx context.Context, rootID string) {
	// A root that never had a checkpoint has nothing to look up.
	if _, err := os.Lstat(s.checkpointBase(rootID)); os.IsNotExist(err) {
		return
	}
	var dirs []string
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		dirs, err = s.orphanCheckpointsOf(tx, rootID)
		return err
	}); err != nil {
		log.G(ctx).WithError(err).Warn("find checkpoints of ended contexts; Cleanup will retry")
		return
	}
	s.removeAll(ctx, dirs)
}

// removeCheckpointTemps removes, at start only, what checkpoints and
// rollbacks cut short left.
func (s *Snapshotter) removeCheckpointTemps(ctx context.Context) error {
	tmps, err := filepath.Glob(filepath.Join(s.root, "checkpoints", "*", "new-*"))
	if err != nil {
		return err
	}
	rbs, err := filepath.Glob(filepath.Join(s.root, "checkpoints", "*", "rb-*"))
	if err != nil {
		return err
	}
	s.removeAll(ctx, append(tmps, rbs...))
	return nil
}

// rollbackForCommit: a branch forked from a checkpoint replaces its
// parent's state, so the parent (at target) is first brought back to that
// checkpoint; the branch's upper is then applied over it.
func (s *Snapshotter) rollbackForCommit(ctx context.Context, r rootSnap, tree *branch.Tree, n *branch.Node, target string, j *apply.Journal) error {
	if n.FromCheckpoint == "" {
		return nil
	}
	var ck *checkpointRecord
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		d, err := loadCheckpoints(tx, r.id())
		if err == nil {
			ck = d.Checkpoints[n.FromCheckpoint]
		}
		return err
	}); err != nil {
		return err
	}
	if ck == nil {
		return fmt.Errorf("checkpoint %q that branch %s was forked from is gone: %w", n.FromCheckpoint, n.ID, errdefs.ErrDataLoss)
	}
	if err := s.rollbackThrough(ctx, r, tree, n.Parent, ck, target, j); err != nil {
		return fmt.Errorf("bring the parent back to checkpoint %q before committing branch %s: %w", ck.Name, n.ID, err)
	}
	return nil
}

// setHead records that context id now builds its next checkpoint on name
// (a commit of a branch forked from name); nothing if name is "".
func setHead(tx *bolt.Tx, rootID, id, name string) error {
	if name == "" {
		return nil
	}
	d, err := loadCheckpoints(tx, rootID)
	if err != nil {
		return err
	}
	if _, ok := d.Checkpoints[name]; !ok {
		return nil
	}
	d.Heads[id] = name
	return storeCheckpoints(tx, rootID, d)
}

// copyDirAttrs gives directory dst the owner, mode and times of src.
func copyDirAttrs(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("stat %s: %w", src, err)
	}
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := os.Chmod(dst, os.FileMode(st.Mode&0o777)|unixModeBits(st.Mode)); err != nil {
		return err
	}
	return os.Chtimes(dst, time.Unix(st.Atim.Unix()), time.Unix(st.Mtim.Unix()))
}

// unixModeBits turns setuid, setgid and sticky bits into os.FileMode's.
func unixModeBits(m uint32) os.FileMode {
	var out os.FileMode
	if m&0o4000 != 0 {
		out |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		out |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		out |= os.ModeSticky
	}
	return out
}
