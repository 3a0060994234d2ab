package branch

// The names and results of the branch API that every side shares: the
// snapshotter and the shim serve them, the clients return them.

import (
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
)

// Root names a root snapshot by key or by upper directory.
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
		return DisplayKey(r.Key)
	}
	return "the sandbox's root snapshot"
}

// Ref names a branch: the root (Branch "" or RootID) or a branch of it.
type Ref struct {
	Root   Root
	Branch string
}

// String names the branch in messages as its user knows it.
func (c Ref) String() string {
	where := c.Root.String()
	if c.Branch == "" || c.Branch == RootID {
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

// Info is one node of a branch tree as the snapshotter reports it.
type Info struct {
	Node
	Sealed      bool
	Children    []string
	UpperSize   int64
	UpperInodes int64
	Mounts      []mount.Mount
	// Quarantine, on the root (RootID) of a tree whose recovery
	// failed in the snapshotter, says why; its branch operations are
	// refused until a retry succeeds.
	Quarantine string
}

// CommitResult is the parent after a commit and the branches it invalidated.
type CommitResult struct {
	Parent      Info
	Invalidated []string
}

// Age is how long ago the branch was created.
func (i Info) Age(now time.Time) time.Duration { return now.Sub(i.Created) }

// Checkpoint is an immutable, named state of a branch's rootfs.
type Checkpoint struct {
	Name string `json:"name"`
	// Branch is the id of the branch it is a state of ("0": the sandbox):
	// in JSON "branch", and "context" too (MarshalJSON).
	Branch string `json:"context"`
	// Parent is the checkpoint whose state this one's layer holds the
	// changes since ("" for a full one, "(deleted)" once that was deleted).
	Parent  string    `json:"parent,omitempty"`
	Created time.Time `json:"created"`
	// Size and Entries are what its own layer holds.
	Size    int64 `json:"size"`
	Entries int64 `json:"entries"`
	Depth   int   `json:"depth"`
	// Head: the branch's next checkpoint builds on this one.
	Head bool `json:"head"`
	// Children are the checkpoints built on it; Branches the live branches
	// forked from it, which keep it from being deleted.
	Children []string `json:"children,omitempty"`
	Branches []string `json:"branches,omitempty"`
	// MemoryBytes is the size of the memory image of its processes, if it
	// was taken with memory (docs/memory-fork.md); MemoryDir is where that
	// image is on the node (the shim restores from it; not for clients).
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	MemoryDir   string `json:"-"`
}

// Age is how long ago the checkpoint was taken.
func (c Checkpoint) Age(now time.Time) time.Duration { return now.Sub(c.Created) }

// CheckpointOptions are what a checkpoint is taken with beyond its
// branch's rootfs.
type CheckpointOptions struct {
	// MemoryDir is a directory holding a memory image of the branch's
	// processes (CRIU's), taken at the rootfs's instant: the checkpoint
	// keeps a copy of it.
	MemoryDir string
	// MaxCheckpoints and MaxBytes bound the checkpoints of the branch's
	// root (0: no bound): a checkpoint that would make them more, or the
	// bytes of their layers and memory images more, is refused with a
	// *CheckpointBoundError and nothing kept.
	MaxCheckpoints int
	MaxBytes       int64
}

// CheckpointOpt sets a CheckpointOptions.
type CheckpointOpt func(*CheckpointOptions)

// WithMemoryImage has the checkpoint keep the memory image in dir.
func WithMemoryImage(dir string) CheckpointOpt {
	return func(o *CheckpointOptions) { o.MemoryDir = dir }
}

// WithCheckpointBounds bounds the checkpoints of the branch's root: at
// most count of them, holding at most bytes (0: no bound).
func WithCheckpointBounds(count int, bytes int64) CheckpointOpt {
	return func(o *CheckpointOptions) { o.MaxCheckpoints, o.MaxBytes = count, bytes }
}

// RollbackOptions say what a rollback brings back beyond the rootfs.
type RollbackOptions struct {
	// Processes: the caller restores the branch's processes from the
	// checkpoint's memory image.
	Processes bool
}

// RollbackOpt sets a RollbackOptions.
type RollbackOpt func(*RollbackOptions)

// WithProcesses says the caller restores the branch's processes from the
// checkpoint's memory image, so a checkpoint taken with memory may be
// rolled back to.
func WithProcesses() RollbackOpt {
	return func(o *RollbackOptions) { o.Processes = true }
}
