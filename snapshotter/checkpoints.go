//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/layer"
)

// Checkpoints are immutable layers beside the branches:
//
//	<root>/checkpoints/<root snapshot id>/<seq>/fs        the layer
//	<root>/checkpoints/<root snapshot id>/<seq>/manifest  the branch's upper as it was
//	<root>/checkpoints/<root snapshot id>/new-<seq>       a layer being written
//	<root>/checkpoints/<root snapshot id>/rb-<branch>    a rollback's scratch layer
//	<root>/mnt/ck-<root snapshot id>-<seq>                a checkpoint's state, mounted
//
// Checkpoint k of a branch holds what changed in the branch's upper since
// the checkpoint it last took or rolled back to (its parent), found by
// comparing the upper with the parent's manifest (inode and ctime of every
// entry of the upper): its state is layer k over its parent's layers over
// the branch's own lowers. So taking one costs a stat per entry of the
// upper plus a copy of what changed, never a walk of the image's layers.
// Rollback finds what changed since the checkpoint the same way, writes the
// checkpoint's version of just those paths into a scratch layer, and applies
// it through the branch's live mount like a commit.
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
	FaultCheckpointInPlace  = "checkpoint:in-place" // its layer renamed into place and synced, not yet recorded
	FaultCheckpointRecorded = "checkpoint:recorded"
	FaultCheckpointDeleted  = "checkpoint:deleted"
	FaultRollbackDecided    = "rollback:decided"
	FaultRollbackApplied    = "rollback:applied"
	FaultRollbackFinished   = "rollback:finished"
)

// lowerDirs is the lower stack of a branch, top first: a branch's
// parent's upper (or, forked from a checkpoint, that checkpoint's layers)
// over its parent's lowers; the root snapshot's own parent layers.
func (s *Branches) lowerDirs(r rootSnap, t *branch.Tree, id string) []string {
	var out []string
	for n := t.Nodes[id]; n != nil && n.ID != branch.RootID; n = t.Nodes[n.Parent] {
		if len(n.CheckpointLayers) > 0 {
			for _, seq := range n.CheckpointLayers {
				out = append(out, filepath.Join(s.checkpointDir(r.id(), seq), "fs"))
			}
		} else {
			out = append(out, s.branchUpper(r.id(), n.Parent))
		}
	}
	for _, p := range r.snap.ParentIDs {
		out = append(out, s.imageLayer(r, p))
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

// lockBranch resolves c, locks its root and returns what the operation
// needs; the caller must call unlock.
func (s *Branches) lockBranch(ctx context.Context, c branch.Ref) (r rootSnap, id string, unlock func(), err error) {
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

// Checkpoint records the current state of branch c's rootfs under name
// (unique among the checkpoints of its root). A running branch is read as
// it is: a file written during the checkpoint is taken as the copy found
// it, as cp would.
func (s *Branches) Checkpoint(ctx context.Context, c branch.Ref, name string, opts ...branch.CheckpointOpt) (_ branch.Checkpoint, retErr error) {
	if err := validCheckpointName(name); err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
	}
	var o branch.CheckpointOptions
	for _, opt := range opts {
		opt(&o)
	}
	r, id, unlock, err := s.lockBranch(ctx, c)
	if err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
	}
	defer unlock()
	parent, seq, err := s.checkpointBaseOf(ctx, c, r, id, name, o)
	if err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint %s as %q: %w", c, name, err)
	}
	var prev layer.Manifest
	if parent != nil {
		if prev, err = s.manifests.load(filepath.Join(s.checkpointDir(r.id(), parent.Seq), "manifest")); err != nil {
			return branch.Checkpoint{}, fmt.Errorf("checkpoint %s as %q: base %q: %w", c, name, parent.Name, err)
		}
	}
	upper := s.branchUpper(r.id(), id)
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
	noRoom := func(err error) error {
		return fmt.Errorf("checkpoint %s as %q: %w", c, name, s.noRoom(err, "its layer", "or delete checkpoints"))
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return branch.Checkpoint{}, noRoom(err)
	}
	if err := os.Mkdir(filepath.Join(tmp, "fs"), 0o755); err != nil {
		return branch.Checkpoint{}, noRoom(err)
	}
	st, memBytes, err := writeCheckpointLayer(ctx, upper, changes, cur, o.MemoryDir, tmp)
	if err != nil {
		return branch.Checkpoint{}, noRoom(err)
	}
	s.fault(FaultCheckpointWritten)
	if err := os.Rename(tmp, final); err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint: move layer into place: %w", err)
	}
	// In place and then on disk, its directory's entry with it, in one
	// go: until its record is written, a layer cut short there is an
	// orphan that recovery removes.
	if err := syncLayer(final, st.Entries, filepath.Dir(final)); err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint %s as %q: write its layer to disk: %w", c, name, err)
	}
	s.fault(FaultCheckpointInPlace)
	// The next rollback to it, or checkpoint after it, reads it back.
	s.manifests.put(filepath.Join(final, "manifest"), cur)
	rec := newCheckpointRecord(name, id, seq, st, memBytes, parent)
	if err := s.recordCheckpoint(ctx, r, id, rec, o); err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint %s as %q: %w", c, name, err)
	}
	// An acknowledged checkpoint outlives a power loss (syncLayer).
	if err := s.bdb.Sync(); err != nil {
		return branch.Checkpoint{}, fmt.Errorf("checkpoint %s as %q: made, but its record could not be written to disk (it may not outlive a power loss): %w", c, name, err)
	}
	s.fault(FaultCheckpointRecorded)
	log.G(ctx).WithFields(log.Fields{"root": r.key, "branch": id, "name": name, "changes": len(changes), "bytes": st.Bytes}).Info("checkpoint")
	return s.describeCheckpoint(r, nil, &checkpointDoc{Heads: map[string]string{id: name}}, rec), nil
}

// newCheckpointRecord is the record of checkpoint name of branch id, number
// seq, whose layer holds st (and memBytes of memory image), built on parent
// if not nil.
func newCheckpointRecord(name, id string, seq uint64, st layer.Stats, memBytes int64, parent *checkpointRecord) *checkpointRecord {
	rec := &checkpointRecord{Name: name, Branch: id, Seq: seq, Created: time.Now(), Size: st.Bytes, Entries: st.Entries, Chain: []uint64{seq}, MemoryBytes: memBytes}
	if parent != nil {
		rec.Parent = parent.Name
		rec.Chain = append(rec.Chain, parent.Chain...)
	}
	return rec
}

// checkpointBaseOf checks that branch id of r can take a checkpoint
// named name, and returns the checkpoint the new one records its changes
// against (its head, unless that chain is full) and the new one's number.
func (s *Branches) checkpointBaseOf(ctx context.Context, c branch.Ref, r rootSnap, id, name string, o branch.CheckpointOptions) (parent *checkpointRecord, seq uint64, err error) {
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
		if err := d.checkBounds(o, 0); err != nil {
			return err
		}
		if p := d.Checkpoints[d.Heads[id]]; p != nil && len(p.Chain) < maxChain {
			parent = p
		}
		seq = d.Next
		return nil
	})
	return parent, seq, err
}

// writeCheckpointLayer writes, in tmp (with its empty fs), the layer of
// changes of upper and the manifest cur, and a copy of the memory image in
// the directory image if one is given.
func writeCheckpointLayer(ctx context.Context, upper string, changes []layer.Change, cur layer.Manifest, image string, tmp string) (layer.Stats, int64, error) {
	st, err := layer.Write(ctx, layer.Source{Root: upper}, changes, filepath.Join(tmp, "fs"))
	if err != nil {
		return layer.Stats{}, 0, fmt.Errorf("copy changes: %w", err)
	}
	if err := layer.SaveManifest(filepath.Join(tmp, "manifest"), cur); err != nil {
		return layer.Stats{}, 0, err
	}
	var memBytes int64
	if image != "" {
		if memBytes, err = copyMemoryImage(image, filepath.Join(tmp, memoryDir)); err != nil {
			return layer.Stats{}, 0, fmt.Errorf("keep the memory image of its processes: %w", err)
		}
	}
	return st, memBytes, nil
}

// recordCheckpoint records rec, a checkpoint of branch id of r whose
// layer is in place, as that branch's head, unless the checkpoints
// changed since its number was taken or it would take them past o's
// bounds.
func (s *Branches) recordCheckpoint(ctx context.Context, r rootSnap, id string, rec *checkpointRecord, o branch.CheckpointOptions) error {
	return s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		tree, d, err := s.loadBoth(tx, r)
		if err != nil {
			return err
		}
		if _, err := tree.Get(id); err != nil {
			return err
		}
		if _, ok := d.Checkpoints[rec.Name]; ok || d.Next != rec.Seq {
			return fmt.Errorf("checkpoints of %s changed meanwhile: %w", branch.DisplayKey(r.key), errdefs.ErrAborted)
		}
		if err := d.checkBounds(o, rec.Size+rec.MemoryBytes); err != nil {
			return err
		}
		d.Checkpoints[rec.Name] = rec
		d.Heads[id] = rec.Name
		d.Next++
		return storeCheckpoints(tx, r.id(), d)
	})
}

// loadBoth reads the branch tree (a new one if none) and the checkpoints of r.
func (s *Branches) loadBoth(tx *bolt.Tx, r rootSnap) (*branch.Tree, *checkpointDoc, error) {
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

// Checkpoints lists the checkpoints of a root snapshot's branches, oldest
// first.
func (s *Branches) Checkpoints(ctx context.Context, root branch.Root) ([]branch.Checkpoint, error) {
	var out []branch.Checkpoint
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		r, _, err := s.resolve(ctx, branch.Ref{Root: root})
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
			out = append(out, s.describeCheckpoint(r, tree, d, c))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	return out, nil
}

func (s *Branches) describeCheckpoint(r rootSnap, t *branch.Tree, d *checkpointDoc, c *checkpointRecord) branch.Checkpoint {
	info := branch.Checkpoint{Name: c.Name, Branch: c.Branch, Parent: c.Parent, Created: c.Created, Size: c.Size, Entries: c.Entries, Depth: len(c.Chain), Head: d.Heads[c.Branch] == c.Name}
	if c.MemoryBytes > 0 {
		info.MemoryBytes = c.MemoryBytes
		info.MemoryDir = filepath.Join(s.checkpointDir(r.id(), c.Seq), memoryDir)
	}
	if t == nil {
		return info
	}
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
func (s *Branches) DeleteCheckpoint(ctx context.Context, root branch.Root, name string) error {
	r, _, unlock, err := s.lockBranch(ctx, branch.Ref{Root: root})
	if err != nil {
		return fmt.Errorf("delete checkpoint %q: %w", name, err)
	}
	defer unlock()
	var (
		gone    []uint64
		memGone bool
		seq     uint64
	)
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		tree, d, err := s.loadBoth(tx, r)
		if err != nil {
			return err
		}
		c := d.Checkpoints[name]
		if c != nil {
			seq = c.Seq
		}
		if c == nil {
			return fmt.Errorf("no checkpoint named %q in %s: %w", name, branch.DisplayKey(r.key), errdefs.ErrNotFound)
		}
		if info := s.describeCheckpoint(r, tree, d, c); len(info.Branches) > 0 {
			return fmt.Errorf("branches %s are built on it; commit or abort them first: %w", strings.Join(info.Branches, ", "), errdefs.ErrFailedPrecondition)
		}
		for id, p := range d.Pending {
			if p == name {
				return fmt.Errorf("a rollback of branch %s to it is under way: %w", id, errdefs.ErrFailedPrecondition)
			}
		}
		delete(d.Checkpoints, name)
		if d.Heads[c.Branch] == name {
			// The branch's next checkpoint is a full one.
			delete(d.Heads, c.Branch)
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
		memGone = c.MemoryBytes > 0
		return storeCheckpoints(tx, r.id(), d)
	})
	if err != nil {
		return fmt.Errorf("delete checkpoint %q: %w", name, err)
	}
	s.fault(FaultCheckpointDeleted)
	// The deletion reaches the disk before the layers go: a record that
	// came back after a power loss would name a layer no longer there.
	if err := s.bdb.Sync(); err != nil {
		log.G(ctx).WithError(err).WithField("checkpoint", name).Warn("write a checkpoint's deletion to disk; its layers are kept until Cleanup")
		return nil
	}
	if memGone {
		// Only its name could restore it, and no chain stacks memory.
		if err := os.RemoveAll(filepath.Join(s.checkpointDir(r.id(), seq), memoryDir)); err != nil {
			log.G(ctx).WithError(err).WithField("checkpoint", name).Warn("remove checkpoint memory image")
		}
	}
	// A crash before this leaves orphans that start-up's Cleanup removes.
	for _, seq := range gone {
		if err := os.RemoveAll(s.checkpointDir(r.id(), seq)); err != nil {
			log.G(ctx).WithError(err).WithField("checkpoint", name).Warn("remove checkpoint layer; Cleanup will retry")
		}
	}
	log.G(ctx).WithFields(log.Fields{"root": r.key, "name": name, "layers removed": len(gone)}).Info("checkpoint deleted")
	return nil
}
