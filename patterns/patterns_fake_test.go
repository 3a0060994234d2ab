//go:build linux

package patterns

import (
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"

	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// fakeBox is a Brancher in memory with the sandbox's rules: a branch
// starts with a copy of its parent's files, only a live leaf commits, the
// first commit into a parent wins and invalidates its siblings (their
// running commands end with status 137), abort ends a subtree, and any
// call on an ended branch fails (stale ones name the winner).
type fakeBox struct {
	t   *testing.T
	run func(c *fakeCall) fakeReply

	mu    sync.Mutex
	nodes map[string]*fakeNode
	next  int
	// runs counts the commands of the test's handler.
	runs int
}

type fakeNode struct {
	id, parent string
	state      branch.State
	winner     string
	files      map[string]string
	dead       chan struct{}
}

// fakeCall is one command the test's handler answers.
type fakeCall struct {
	Branch string
	Args   []string
	Env    map[string]string
	// Files are the branch's files when the command starts.
	Files map[string]string
}

type fakeReply struct {
	Out   string
	Code  int
	Delay time.Duration
	// Writes land in the branch when the command exits (not if killed).
	Writes map[string]string
}

func newFake(t *testing.T, run func(c *fakeCall) fakeReply) *fakeBox {
	f := &fakeBox{t: t, run: run, next: 1, nodes: map[string]*fakeNode{
		branch.RootID: {id: branch.RootID, state: branch.Live, files: map[string]string{"/base": "base"}, dead: make(chan struct{})},
	}}
	t.Cleanup(func() {
		if live := f.live(); len(live) > 0 {
			t.Errorf("branches left live: %v", live)
		}
	})
	return f
}

func (f *fakeBox) live() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for id, n := range f.nodes {
		if id != branch.RootID && n.state == branch.Live {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func (f *fakeBox) rootFiles() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.nodes[branch.RootID].files)
}

// get returns a live node or the error the shim would give. Called with
// f.mu held.
func (f *fakeBox) get(id string) (*fakeNode, error) {
	if id == "" {
		id = branch.RootID
	}
	n, ok := f.nodes[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("branch %s: %w", id, errdefs.ErrNotFound)
	case n.state == branch.Stale:
		return nil, &branch.StaleError{Branch: id, Winner: n.winner}
	case n.state != branch.Live:
		return nil, fmt.Errorf("branch %s is %s: %w", id, n.state, errdefs.ErrNotFound)
	}
	return n, nil
}

func (f *fakeBox) children(id string) []*fakeNode {
	var out []*fakeNode
	for _, n := range f.nodes {
		if n.parent == id && n.state == branch.Live {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b *fakeNode) int { x, _ := strconv.Atoi(a.id); y, _ := strconv.Atoi(b.id); return x - y })
	return out
}

// end ends a node and its live subtree.
func (f *fakeBox) end(n *fakeNode, state branch.State, winner string) []string {
	ids := []string{n.id}
	for _, k := range f.children(n.id) {
		ids = append(ids, f.end(k, state, winner)...)
	}
	n.state, n.winner = state, winner
	close(n.dead)
	return ids
}

func (f *fakeBox) Fork(ctx context.Context, opts client.ForkOptions) ([]client.BranchInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.get(opts.Parent)
	if err != nil {
		return nil, err
	}
	var out []client.BranchInfo
	for range opts.Count {
		id := strconv.Itoa(f.next)
		f.next++
		f.nodes[id] = &fakeNode{id: id, parent: p.id, state: branch.Live, files: maps.Clone(p.files), dead: make(chan struct{})}
		out = append(out, client.BranchInfo{Node: branch.Node{ID: id, Parent: p.id, State: branch.Live}})
	}
	return out, nil
}

func (f *fakeBox) Run(ctx context.Context, branchID string, opts client.ExecOptions) (client.ExitStatus, error) {
	f.mu.Lock()
	n, err := f.get(branchID)
	if err != nil {
		f.mu.Unlock()
		return client.ExitStatus{}, err
	}
	files := maps.Clone(n.files)
	f.mu.Unlock()
	var reply fakeReply
	args := opts.Args
	switch {
	case isWriteFile(args):
		path, data, _ := parseWriteFileArgs(args)
		reply.Writes = map[string]string{path: data}
	case args[0] == "cat":
		v, ok := files[args[1]]
		if !ok {
			reply = fakeReply{Out: "cat: " + args[1] + ": No such file or directory\n", Code: 1}
		}
		reply.Out += v
	case args[0] == "rm":
		f.mu.Lock()
		delete(n.files, args[len(args)-1])
		f.mu.Unlock()
	default:
		env := map[string]string{}
		for _, kv := range opts.Env {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		f.mu.Lock()
		f.runs++
		f.mu.Unlock()
		reply = f.run(&fakeCall{Branch: branchID, Args: args, Env: env, Files: files})
	}
	// Output goes out as the command runs; files land when it exits.
	_, _ = io.WriteString(opts.Stdout, reply.Out)
	select {
	case <-time.After(reply.Delay):
	case <-n.dead:
		return client.ExitStatus{Code: 137}, nil
	case <-ctx.Done():
		return client.ExitStatus{}, ctx.Err()
	}
	f.mu.Lock()
	if n.state == branch.Live {
		for k, v := range reply.Writes {
			n.files[k] = v
		}
	}
	f.mu.Unlock()
	return client.ExitStatus{Code: reply.Code}, nil
}

func (f *fakeBox) Commit(ctx context.Context, branchID string) (client.SandboxCommitResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.get(branchID)
	if err != nil {
		return client.SandboxCommitResult{}, err
	}
	if len(f.children(n.id)) > 0 {
		return client.SandboxCommitResult{}, fmt.Errorf("commit %s: it has live branches: %w", n.id, errdefs.ErrFailedPrecondition)
	}
	p := f.nodes[n.parent]
	p.files = maps.Clone(n.files)
	f.end(n, branch.Committed, "")
	var res client.SandboxCommitResult
	for _, s := range f.children(p.id) {
		f.end(s, branch.Stale, n.id)
		res.Invalidated = append(res.Invalidated, s.id)
	}
	res.Parent = client.BranchInfo{Node: branch.Node{ID: p.id}}
	return res, nil
}

func (f *fakeBox) Abort(ctx context.Context, branchID string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.get(branchID)
	if err != nil {
		return nil, err
	}
	return f.end(n, branch.Aborted, ""), nil
}

func isWriteFile(args []string) bool {
	_, _, ok := parseWriteFileArgs(args)
	return ok
}
