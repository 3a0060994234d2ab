// Package branch is the domain core of branchbox and its Go client.
//
// The core is a Tree: one branch tree per sandbox root, holding the
// sandbox (its root) and every branch forked from it, with the rules that make
// branching safe — only a live branch (or sandbox) may fork, one with live
// children is sealed, only a leaf may commit, the first commit into a
// parent wins and every sibling (with its descendants) becomes stale, and a
// stale branch stays known so that any later call on it can name the winner.
// The Tree is pure data and logic; the snapshotter persists it and does the
// filesystem work that each transition plans.
package branch

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// State is where a branch is in its life.
type State string

const (
	// Live branches can run, fork, commit and abort.
	Live State = "live"
	// Committing marks a winner whose changes are being applied to its
	// parent; it becomes Committed when that is done.
	Committing State = "committing"
	// Committed: its changes are its parent's now and it is gone.
	Committed State = "committed"
	// Aborted: discarded on request.
	Aborted State = "aborted"
	// Stale: a sibling (or a sibling of an ancestor) committed first.
	Stale State = "stale"
)

// RootID is the ID of the root of every tree.
const RootID = "0"

// Node is one node of the tree, a branch: the root (the sandbox, its own
// snapshot) or a branch forked from it.
type Node struct {
	ID     string `json:"id"`
	Parent string `json:"parent,omitempty"`
	State  State  `json:"state"`
	// Epoch counts the commits made into this branch.
	Epoch uint64 `json:"epoch"`
	// ForkEpoch is the parent's epoch when this branch was forked.
	ForkEpoch uint64    `json:"forkEpoch"`
	Created   time.Time `json:"created"`
	Ended     time.Time `json:"ended,omitempty"`
	// Winner and WinnerEpoch say, for a stale branch, which branch
	// committed first and the epoch that commit made.
	Winner      string `json:"winner,omitempty"`
	WinnerEpoch uint64 `json:"winnerEpoch,omitempty"`
	// SealedByUs records that this branch's live mount was writable and
	// was made read-only because it has children, so it must be made
	// writable again when its last child ends (and not otherwise: a
	// read-only rootfs stays read-only).
	SealedByUs bool `json:"sealedByUs,omitempty"`
	// SealMode says how a branch SealedByUs was sealed, so that unseal
	// and recovery undo exactly that: SealSuperblock (""), SealMounts
	// (each mount in SealedMounts made read-only) or SealCaller (its
	// processes were frozen by the caller; nothing was remounted).
	SealMode     string        `json:"sealMode,omitempty"`
	SealedMounts []SealedMount `json:"sealedMounts,omitempty"`
	// FromCheckpoint names the checkpoint of its parent this branch was
	// forked from ("" for a fork over the parent's current state), and
	// CheckpointLayers that checkpoint's layers, newest first: its lowers
	// in place of the parent's own upper.
	FromCheckpoint   string   `json:"fromCheckpoint,omitempty"`
	CheckpointLayers []uint64 `json:"checkpointLayers,omitempty"`
}

// How a branch is sealed (Node.SealMode).
const (
	// SealSuperblock: its overlay superblock was remounted read-only,
	// which reaches every mount of it.
	SealSuperblock = ""
	// SealMounts: each mount of its overlay, in every mount namespace,
	// was made read-only on its own (the superblock could not be: it
	// holds files unlinked while open).
	SealMounts = "mounts"
	// SealCaller: the caller froze its processes; nothing was remounted.
	SealCaller = "caller"
)

// SealedMount is one mount made read-only by a per-mount seal: the mount
// namespace (its inode number) and the mount's id there, with a process
// of that namespace seen at the seal, tried first to enter it again.
type SealedMount struct {
	NS      uint64 `json:"ns"`
	MountID uint64 `json:"mountId"`
	Pid     int    `json:"pid,omitempty"`
}

// Tree is the branch tree of one sandbox root. Nodes holds the branches
// that still have a layer (the root, live and committing branches); a node
// that ends leaves Nodes for Ended, from which its store takes it to keep
// as a tombstone, so that a later call on it can say what became of it.
type Tree struct {
	// Root names the root snapshot, for messages.
	Root  string           `json:"root"`
	Next  uint64           `json:"next"`
	Nodes map[string]*Node `json:"nodes"`

	ended  []*Node
	lookup func(id string) *Node
}

// SetTombstones tells the tree where to find nodes that ended earlier.
func (t *Tree) SetTombstones(lookup func(id string) *Node) { t.lookup = lookup }

// TakeEnded returns the nodes that ended since the last call, for the store
// to keep as tombstones.
func (t *Tree) TakeEnded() []*Node {
	e := t.ended
	t.ended = nil
	return e
}

func (t *Tree) end(n *Node, state State, now time.Time) {
	n.State, n.Ended = state, now
	delete(t.Nodes, n.ID)
	t.ended = append(t.ended, n)
}

// node finds id among the live nodes, the nodes ended in this change, and
// the tombstones.
func (t *Tree) node(id string) (*Node, bool) {
	if n, ok := t.Nodes[id]; ok {
		return n, true
	}
	for _, n := range t.ended {
		if n.ID == id {
			return n, true
		}
	}
	if t.lookup != nil {
		if n := t.lookup(id); n != nil {
			return n, true
		}
	}
	return nil, false
}

// NewTree returns a tree holding only the live root.
func NewTree(root string, now time.Time) *Tree {
	return &Tree{
		Root:  root,
		Next:  1,
		Nodes: map[string]*Node{RootID: {ID: RootID, State: Live, Created: now}},
	}
}

// StaleError is returned for any operation on a branch that lost a commit
// race. It wraps errdefs.ErrAborted: the caller's transaction lost.
type StaleError struct {
	Branch      string
	Winner      string
	WinnerEpoch uint64
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("branch %s is stale: branch %s committed first (epoch %d)", e.Branch, e.Winner, e.WinnerEpoch)
}

// Unwrap makes errdefs.IsAborted true for a StaleError.
func (e *StaleError) Unwrap() error { return errdefs.ErrAborted }

// Writer is a process holding a file of a rootfs open (or mapped) for
// writing.
type Writer struct {
	Pid     int
	Command string
	// Path is the file as the process sees it.
	Path string
}

func (w Writer) String() string {
	return fmt.Sprintf("%s (pid %d, %s)", w.Path, w.Pid, w.Command)
}

// WritersError is a seal refused because files of the branch's rootfs
// are open for writing: those files cannot be made read-only under their
// writers. errdefs.IsFailedPrecondition is true for it.
type WritersError struct {
	Branch  string
	Writers []Writer
}

func (e *WritersError) Error() string {
	if len(e.Writers) == 0 {
		return fmt.Sprintf("seal %s: a file of its rootfs is open for writing (close it, or fork with --seal freeze)", e.Branch)
	}
	ws := make([]string, 0, len(e.Writers))
	for i, w := range e.Writers {
		if i == 8 {
			ws = append(ws, fmt.Sprintf("and %d more", len(e.Writers)-i))
			break
		}
		ws = append(ws, w.String())
	}
	return fmt.Sprintf("seal %s: files of its rootfs are open for writing: %s (close them, or fork with --seal freeze if they are the sandbox's own processes)", e.Branch, strings.Join(ws, ", "))
}

// Unwrap makes errdefs.IsFailedPrecondition true for a WritersError.
func (e *WritersError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// Get returns the live node id or an error that says why it is not usable.
func (t *Tree) Get(id string) (*Node, error) {
	n, ok := t.node(id)
	if !ok {
		return nil, fmt.Errorf("branch %s of %s: %w", strconv.Quote(id), DisplayKey(t.Root), errdefs.ErrNotFound)
	}
	switch n.State {
	case Live:
		return n, nil
	case Stale:
		return nil, &StaleError{Branch: id, Winner: n.Winner, WinnerEpoch: n.WinnerEpoch}
	case Committing:
		return nil, fmt.Errorf("branch %s is being committed into %s: %w", id, parentName(n.Parent), errdefs.ErrFailedPrecondition)
	case Committed:
		return nil, fmt.Errorf("branch %s was committed into %s (epoch %d) and no longer exists: %w", id, parentName(n.Parent), n.WinnerEpoch, errdefs.ErrNotFound)
	case Aborted:
		return nil, fmt.Errorf("branch %s was aborted: %w", id, errdefs.ErrNotFound)
	}
	return nil, fmt.Errorf("branch %s has unknown state %q: %w", id, n.State, errdefs.ErrUnknown)
}

func parentName(id string) string {
	if id == RootID {
		return "the root"
	}
	return "branch " + id
}

// Children returns the live (or committing) children of id, sorted.
func (t *Tree) Children(id string) []string {
	var out []string
	for _, n := range t.Nodes {
		if n.Parent == id && n.ID != RootID {
			out = append(out, n.ID)
		}
	}
	sortIDs(out)
	return out
}

// Sealed reports whether id has live children, so its layer must not change.
func (t *Tree) Sealed(id string) bool { return len(t.Children(id)) > 0 }

// Depth is the number of branches between id and the root.
func (t *Tree) Depth(id string) int {
	d := 0
	for n := t.Nodes[id]; n != nil && n.ID != RootID; n = t.Nodes[n.Parent] {
		d++
	}
	return d
}

// Ancestors returns id's parent, grandparent, ... up to and including the
// root: the order of its lower layers.
func (t *Tree) Ancestors(id string) []string {
	var out []string
	for n := t.Nodes[id]; n != nil && n.ID != RootID; {
		out = append(out, n.Parent)
		n = t.Nodes[n.Parent]
	}
	return out
}

// Fork adds count live children to parent and returns their IDs.
func (t *Tree) Fork(parent string, count int, now time.Time) ([]string, error) {
	if count < 1 {
		return nil, fmt.Errorf("fork of %s: count must be at least 1, got %d: %w", parentName(parent), count, errdefs.ErrInvalidArgument)
	}
	p, err := t.Get(parent)
	if err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	ids := make([]string, count)
	for i := range ids {
		id := strconv.FormatUint(t.Next, 10)
		t.Next++
		t.Nodes[id] = &Node{ID: id, Parent: parent, State: Live, ForkEpoch: p.Epoch, Created: now}
		ids[i] = id
	}
	return ids, nil
}

// CommitPlan is what a commit decided: the winner's changes go into Parent,
// which reaches Epoch; Invalidated lists every branch that became stale.
type CommitPlan struct {
	Winner      string
	Parent      string
	Epoch       uint64
	Invalidated []string
}

// BeginCommit decides a commit of id into its parent: first commit wins.
// The winner becomes Committing and its siblings and their descendants
// Stale; FinishCommit ends it once the changes are applied.
func (t *Tree) BeginCommit(id string, now time.Time) (CommitPlan, error) {
	if id == RootID {
		return CommitPlan{}, fmt.Errorf("commit: the root of %s has no parent to commit into: %w", DisplayKey(t.Root), errdefs.ErrInvalidArgument)
	}
	n, err := t.Get(id)
	if err != nil {
		return CommitPlan{}, fmt.Errorf("commit: %w", err)
	}
	if kids := t.Children(id); len(kids) > 0 {
		return CommitPlan{}, fmt.Errorf("commit: branch %s has %d live children (%s); only a leaf may commit, so commit or abort them first: %w",
			id, len(kids), strings.Join(kids, ", "), errdefs.ErrFailedPrecondition)
	}
	p, err := t.Get(n.Parent)
	if err != nil {
		return CommitPlan{}, fmt.Errorf("commit of branch %s: parent: %w", id, err)
	}
	p.Epoch++
	plan := CommitPlan{Winner: id, Parent: p.ID, Epoch: p.Epoch}
	n.State = Committing
	n.WinnerEpoch = p.Epoch
	for _, sib := range t.Children(p.ID) {
		if sib == id {
			continue
		}
		for _, s := range t.Subtree(sib) {
			sn := t.Nodes[s]
			sn.Winner, sn.WinnerEpoch = id, p.Epoch
			t.end(sn, Stale, now)
			plan.Invalidated = append(plan.Invalidated, s)
		}
	}
	sortIDs(plan.Invalidated)
	return plan, nil
}

// FinishCommit marks a committing branch committed.
func (t *Tree) FinishCommit(id string, now time.Time) error {
	n, ok := t.Nodes[id]
	if !ok || n.State != Committing {
		return fmt.Errorf("finish commit of branch %s: not committing: %w", id, errdefs.ErrFailedPrecondition)
	}
	t.end(n, Committed, now)
	return nil
}

// AbandonCommit ends a committing branch as aborted: its commit was
// decided but could not be applied, and its parent was put back as it was.
// Its siblings stay stale and the parent keeps the epoch the decision gave
// it, so that what the stale ones say stays true.
func (t *Tree) AbandonCommit(id string, now time.Time) error {
	n, ok := t.Nodes[id]
	if !ok || n.State != Committing {
		return fmt.Errorf("abandon commit of branch %s: not committing: %w", id, errdefs.ErrFailedPrecondition)
	}
	t.end(n, Aborted, now)
	return nil
}

// Ended returns node id as it ended (committed, aborted or stale), if it
// did and is still remembered.
func (t *Tree) Ended(id string) (Node, bool) {
	if _, live := t.Nodes[id]; live {
		return Node{}, false
	}
	n, ok := t.node(id)
	if !ok {
		return Node{}, false
	}
	return *n, true
}

// Committing returns the branches whose commit began but did not finish.
func (t *Tree) Committing() []string {
	var out []string
	for _, n := range t.Nodes {
		if n.State == Committing {
			out = append(out, n.ID)
		}
	}
	sortIDs(out)
	return out
}

// Abort discards id and its descendants and returns them, deepest last.
func (t *Tree) Abort(id string, now time.Time) ([]string, error) {
	if id == RootID {
		return nil, fmt.Errorf("abort: the root of %s cannot be aborted; remove the snapshot instead: %w", DisplayKey(t.Root), errdefs.ErrInvalidArgument)
	}
	if _, err := t.Get(id); err != nil {
		return nil, fmt.Errorf("abort: %w", err)
	}
	ids := t.Subtree(id)
	for _, s := range ids {
		t.end(t.Nodes[s], Aborted, now)
	}
	return ids, nil
}

// Subtree returns id and every descendant still holding a layer, parents
// before children.
func (t *Tree) Subtree(id string) []string {
	parents := make(map[string]string, len(t.Nodes))
	for _, n := range t.Nodes {
		if n.ID != RootID {
			parents[n.ID] = n.Parent
		}
	}
	return Subtree(id, parents)
}

// Layered returns every branch that owns a layer on disk: live or
// committing ones.
func (t *Tree) Layered() []string {
	var out []string
	for id := range t.Nodes {
		if id != RootID {
			out = append(out, id)
		}
	}
	sortIDs(out)
	return out
}

// sortIDs sorts numeric IDs numerically.
func sortIDs(ids []string) {
	sort.Slice(ids, func(i, j int) bool {
		if len(ids[i]) != len(ids[j]) {
			return len(ids[i]) < len(ids[j])
		}
		return ids[i] < ids[j]
	})
}
