//go:build linux

package oci

import (
	"context"
	"fmt"

	"github.com/branchbox/branchbox/client/branchapi"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
)

// state is one state of a branch on the way from its image to what is
// pushed: a checkpoint (Checkpoint set) or the branch now. Each becomes
// one layer: the difference from the state before it.
type state struct {
	Checkpoint string
	Mounts     []mount.Mount
	// MemoryDir is the checkpoint's memory image, if it was taken with
	// memory ("": none).
	MemoryDir string
}

// statePath returns the states src's image holds, oldest first: the
// checkpoints on the path to it (the branch's head checkpoint, or the one
// src names, and the checkpoints each was built on, back to the first; for
// a branch, before them, those on its parent's path to the state it was
// forked from: the checkpoint it was forked from, or its parent's head, as
// far back as its root), then, unless src names a checkpoint, the branch
// now. branchID is the branch the path is of.
func statePath(ctx context.Context, upper string, rootMounts []mount.Mount, src Source) (path []state, branchID string, err error) {
	c, err := dialSnapshotterOf(upper)
	if err != nil {
		return nil, "", fmt.Errorf("sandbox %s: %w", src.Sandbox, err)
	}
	defer c.Close()
	sbRoot := branch.Root{Upperdir: upper}
	cks, err := c.Checkpoints(ctx, sbRoot)
	if err != nil {
		return nil, "", fmt.Errorf("sandbox %s: its checkpoints: %w", src.Sandbox, err)
	}
	byName := map[string]branch.Checkpoint{}
	for _, ck := range cks {
		byName[ck.Name] = ck
	}

	branchID = branch.RootID
	if src.Branch != "" {
		branchID = src.Branch
	}
	var last string // the newest checkpoint on the path
	if src.Checkpoint != "" {
		ck, ok := byName[src.Checkpoint]
		if !ok {
			return nil, "", fmt.Errorf("sandbox %s has no checkpoint %q (list them with: branchctl checkpoint ls %s): %w", src.Sandbox, src.Checkpoint, src.Sandbox, errdefs.ErrNotFound)
		}
		branchID, last = ck.Branch, ck.Name
	} else {
		last = headOf(byName, branchID)
	}
	// Back along the parents, within each branch: a deleted parent ends
	// that branch's part (the next layer then holds its change too).
	chain := func(last, branchID string) []branch.Checkpoint {
		var cks []branch.Checkpoint
		for n := last; n != ""; {
			ck, ok := byName[n]
			if !ok || ck.Branch != branchID {
				break
			}
			cks = append([]branch.Checkpoint{ck}, cks...)
			n = ck.Parent
		}
		return cks
	}
	onPath := chain(last, branchID)
	if branchID != branch.RootID {
		// A branch holds its parent's state at the fork: the parent is
		// sealed while the branch lives, so its head (or the checkpoint
		// the branch was forked from) is on the branch's path.
		nodes, err := c.Tree(ctx, sbRoot)
		if err != nil {
			return nil, "", fmt.Errorf("sandbox %s: its branches: %w", src.Sandbox, err)
		}
		byID := map[string]branch.Info{}
		for _, n := range nodes {
			byID[n.ID] = n
		}
		for cur := branchID; cur != branch.RootID; {
			n, ok := byID[cur]
			if !ok {
				return nil, "", fmt.Errorf("sandbox %s has no branch %s (list them with: branchctl tree %s): %w", src.Sandbox, cur, src.Sandbox, errdefs.ErrNotFound)
			}
			from := n.FromCheckpoint
			if from == "" {
				from = headOf(byName, n.Parent)
			}
			onPath = append(chain(from, n.Parent), onPath...)
			cur = n.Parent
		}
	}
	for _, ck := range onPath {
		ref := branch.Ref{Root: sbRoot, Branch: ck.Branch}
		if ck.Branch == branch.RootID {
			ref.Branch = ""
		}
		ms, err := c.CheckpointMounts(ctx, ref, ck.Name)
		if err != nil {
			return nil, "", fmt.Errorf("sandbox %s: checkpoint %s: %w", src.Sandbox, ck.Name, err)
		}
		path = append(path, state{Checkpoint: ck.Name, Mounts: ms, MemoryDir: ck.MemoryDir})
	}
	if src.Checkpoint != "" {
		return path, branchID, nil
	}
	now := rootMounts
	if branchID != branch.RootID {
		if now, err = c.Mounts(ctx, branch.Ref{Root: sbRoot, Branch: branchID}); err != nil {
			if errdefs.IsNotFound(err) {
				return nil, "", fmt.Errorf("sandbox %s has no branch %s (list them with: branchctl tree %s): %w", src.Sandbox, src.Branch, src.Sandbox, err)
			}
			return nil, "", fmt.Errorf("%s: mounts of the branch: %w", src, err)
		}
	}
	return append(path, state{Mounts: now}), branchID, nil
}

// headOf names branch branchID's head checkpoint ("" if it has none).
func headOf(byName map[string]branch.Checkpoint, branchID string) string {
	for _, ck := range byName {
		if ck.Branch == branchID && ck.Head {
			return ck.Name
		}
	}
	return ""
}

// dialSnapshotterOf connects to the branch API of the snapshotter that
// owns upper (a root snapshot's upper directory), found as the shim finds
// it: its address file, in the snapshotter's root.
func dialSnapshotterOf(upper string) (*branchapi.Client, error) {
	root, err := branch.RootOfUpper(upper)
	if err != nil {
		return nil, err
	}
	addr, err := branchapi.AddressOf(root)
	if err != nil {
		return nil, err
	}
	c, err := branchapi.Dial(addr)
	if err != nil {
		return nil, fmt.Errorf("connect to the branch snapshotter: %w", err)
	}
	return c, nil
}
