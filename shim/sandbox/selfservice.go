//go:build linux

package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/proto"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/internal/fifoio"

	"github.com/branchbox/branchbox/branch"
	"github.com/containerd/errdefs"
)

// selfService is the API served on one branch's socket. Requests go to
// the shim's own branch API once their ids are resolved from self.
type selfService struct {
	c       *Service
	sandbox string
	self    string
}

// resolve returns id ("" meaning the caller's branch) if it is the
// caller's branch or one of its descendants, live or ended.
func (s *selfService) resolve(ctx context.Context, id string) (string, error) {
	if id == "" || id == s.self {
		return s.self, nil
	}
	sb, err := s.c.Sandbox(s.sandbox)
	if err != nil {
		return "", err
	}
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := s.c.view(ctx, sb); err != nil {
		return "", err
	}
	parents := map[string]string{}
	for _, n := range sb.nodes {
		parents[n.id] = n.parent
	}
	if _, ok := parents[id]; !ok {
		// Ended branches are known to the snapshotter; ids are never reused,
		// so a branch's ancestry does not change.
		infos, err := sb.snapshot.Tree(ctx, sb.root())
		if err != nil {
			return "", err
		}
		for _, i := range infos {
			parents[i.ID] = i.Parent
		}
	}
	if _, ok := parents[id]; ok {
		for cur, i := parents[id], 0; cur != "" && i < len(parents); cur, i = parents[cur], i+1 {
			if cur == s.self {
				return id, nil
			}
		}
	}
	return "", fmt.Errorf("branch %q is not this branch (%s) or one of its descendants; a branch socket reaches only its own branch and what was forked from it: %w", id, s.self, errdefs.ErrPermissionDenied)
}

// hide clears what only makes sense on the host: host pids and cgroup paths.
func hide(d *shimv1.Branch) *shimv1.Branch {
	if d != nil {
		d.InitPid, d.Pids, d.Cgroup = 0, nil, ""
	}
	return d
}

func (s *selfService) Fork(ctx context.Context, req *shimv1.SelfForkRequest) (_ *shimv1.ForkResponse, retErr error) {
	ctx, stop := callerDeadline(ctx)
	defer stop()
	defer func() { retErr = s.hostless(toTTRPC(retErr)) }()
	parent, err := s.resolve(ctx, req.Parent)
	if err != nil {
		return nil, err
	}
	sb, err := s.c.Sandbox(s.sandbox)
	if err != nil {
		return nil, err
	}
	if err := sb.throttleSelfFork(ctx, int(req.Count)); err != nil {
		return nil, err
	}
	freq := &shimv1.ForkRequest{
		Sandbox: s.sandbox, Parent: parent, Count: req.Count, Seal: req.Seal, Net: req.Net,
		Limits: req.Limits, Args: req.Args, FromCheckpoint: req.FromCheckpoint, Memory: req.Memory,
	}
	if req.Memory && req.FromCheckpoint == "" && parent == s.self {
		// The caller is among the processes to copy (selfcall.go).
		token, err := s.callLater(ctx, "memory fork", func(ctx context.Context) (proto.Message, error) {
			resp, err := s.c.Fork(ctx, freq)
			if err != nil {
				return nil, err
			}
			for _, b := range resp.Branches {
				hide(b)
			}
			return resp, nil
		})
		if err != nil {
			return nil, err
		}
		return &shimv1.ForkResponse{Pending: token}, nil
	}
	if req.Memory {
		// A descendant's processes: the caller is not among them.
		ctx = context.WithValue(ctx, callerApartKey{}, true)
	}
	resp, err := s.c.Fork(withSelfFork(ctx), freq)
	if err != nil {
		return nil, err
	}
	for _, b := range resp.Branches {
		hide(b)
	}
	return resp, nil
}

func (s *selfService) Exec(ctx context.Context, req *shimv1.SelfExecRequest) (_ *shimv1.SelfExecResponse, retErr error) {
	ctx, stop := callerDeadline(ctx)
	defer stop()
	defer func() { retErr = s.hostless(toTTRPC(retErr)) }()
	if len(req.Args) == 0 {
		return nil, fmt.Errorf("exec: no command given: %w", errdefs.ErrInvalidArgument)
	}
	target, err := s.resolve(ctx, req.Branch)
	if err != nil {
		return nil, err
	}
	if target == branch.RootID {
		return nil, fmt.Errorf("exec: the sandbox itself runs its own commands; exec into its branches: %w", errdefs.ErrInvalidArgument)
	}
	sb, err := s.c.Sandbox(s.sandbox)
	if err != nil {
		return nil, err
	}
	in := &s.c.insock
	in.mu.Lock()
	n := 0
	for k := range in.execs {
		if strings.HasPrefix(k, s.sandbox+"/") {
			n++
		}
	}
	if n >= selfExecMax {
		in.mu.Unlock()
		return nil, fmt.Errorf("exec: %d processes started through branch sockets are not waited for yet; wait for them first: %w", n, errdefs.ErrResourceExhausted)
	}
	in.seq++
	execID := fmt.Sprintf("self-%d", in.seq)
	in.mu.Unlock()

	e := &selfExec{target: target, stdout: newTailBuffer(sb.output), stderr: newTailBuffer(sb.output)}
	// The FIFOs go in the branch's bundle, which goes with the branch.
	e.io, err = fifoio.New(filepath.Join(sb.bundle, branchesDir, target), execID, false, nil, e.stdout, e.stderr)
	if err != nil {
		e.release()
		return nil, fmt.Errorf("exec in %s: set up output: %w", target, err)
	}
	resp, err := s.c.Exec(ctx, &shimv1.ExecRequest{
		Sandbox: s.sandbox, Branch: target, ExecId: execID, Args: req.Args, Env: req.Env, Cwd: req.Cwd,
		Stdout: e.io.Stdout, Stderr: e.io.Stderr,
	})
	if err != nil {
		e.io.Close()
		e.release()
		return nil, err
	}
	e.pid = resp.Pid
	e.io.Start(func() {})
	in.mu.Lock()
	if in.execs == nil {
		in.execs = map[string]*selfExec{}
	}
	in.execs[selfKey(s.sandbox, execID)] = e
	in.mu.Unlock()
	return &shimv1.SelfExecResponse{ExecId: execID}, nil
}

// execFor finds a process started through a socket, if the caller may
// reach its branch.
func (s *selfService) execFor(ctx context.Context, b, execID string) (*selfExec, error) {
	s.c.insock.mu.Lock()
	e := s.c.insock.execs[selfKey(s.sandbox, execID)]
	s.c.insock.mu.Unlock()
	if e == nil {
		return nil, fmt.Errorf("no process %q started through a branch socket is waiting to be collected: %w", execID, errdefs.ErrNotFound)
	}
	if b != "" && b != e.target {
		return nil, fmt.Errorf("process %q runs in %s, not in %s: %w", execID, e.target, b, errdefs.ErrNotFound)
	}
	if _, err := s.resolve(ctx, e.target); err != nil {
		return nil, err
	}
	return e, nil
}

func (s *selfService) Wait(ctx context.Context, req *shimv1.SelfWaitRequest) (_ *shimv1.SelfWaitResponse, retErr error) {
	defer func() { retErr = s.hostless(toTTRPC(retErr)) }()
	e, err := s.execFor(ctx, req.Branch, req.ExecId)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	w := e.exit
	e.mu.Unlock()
	if w == nil {
		// The shim's Wait forgets the exec: its answer is kept for a
		// Wait after one that ctx ended while the output was read.
		if w, err = s.c.Wait(ctx, &shimv1.WaitRequest{Sandbox: s.sandbox, Branch: e.target, ExecId: req.ExecId}); err != nil {
			return nil, err
		}
		e.mu.Lock()
		e.exit = w
		e.mu.Unlock()
	}
	// A process the exec left running (in the background) may hold the
	// output open: waited for as long as the call.
	if err := e.io.Release(ctx); err != nil {
		return nil, err
	}
	s.c.insock.mu.Lock()
	delete(s.c.insock.execs, selfKey(s.sandbox, req.ExecId))
	s.c.insock.mu.Unlock()
	resp := &shimv1.SelfWaitResponse{ExitStatus: w.ExitStatus, ExitedAt: w.ExitedAt, OomKilled: w.OomKilled, BranchEnded: w.BranchEnded}
	var t1, t2 bool
	resp.Stdout, t1 = e.stdout.bytes()
	resp.Stderr, t2 = e.stderr.bytes()
	resp.Truncated = t1 || t2
	e.release()
	return resp, nil
}

func (s *selfService) Kill(ctx context.Context, req *shimv1.SelfKillRequest) (_ *shimv1.Empty, retErr error) {
	defer func() { retErr = s.hostless(toTTRPC(retErr)) }()
	e, err := s.execFor(ctx, req.Branch, req.ExecId)
	if err != nil {
		return nil, err
	}
	return s.c.Kill(ctx, &shimv1.KillRequest{Sandbox: s.sandbox, Branch: e.target, ExecId: req.ExecId, Signal: req.Signal, All: req.All, Pid: e.pid})
}

func (s *selfService) Commit(ctx context.Context, req *shimv1.SelfCommitRequest) (_ *shimv1.CommitResponse, retErr error) {
	defer func() { retErr = s.hostless(toTTRPC(retErr)) }()
	target, err := s.resolve(ctx, req.Branch)
	if err != nil {
		return nil, err
	}
	if target == branch.RootID {
		return nil, fmt.Errorf("commit: the sandbox itself has no parent to commit into: %w", errdefs.ErrInvalidArgument)
	}
	// Committing itself kills the caller and closes this connection, which
	// cancels ctx: the commit must go on regardless.
	resp, err := s.c.Commit(context.WithoutCancel(ctx), &shimv1.CommitRequest{Sandbox: s.sandbox, Branch: target})
	if err != nil {
		return nil, err
	}
	hide(resp.Parent)
	return resp, nil
}

func (s *selfService) Abort(ctx context.Context, req *shimv1.SelfAbortRequest) (_ *shimv1.AbortResponse, retErr error) {
	defer func() { retErr = s.hostless(toTTRPC(retErr)) }()
	target, err := s.resolve(ctx, req.Branch)
	if err != nil {
		return nil, err
	}
	if target == branch.RootID {
		return nil, fmt.Errorf("abort: the sandbox itself is not a branch; its task ends it: %w", errdefs.ErrInvalidArgument)
	}
	return s.c.Abort(context.WithoutCancel(ctx), &shimv1.AbortRequest{Sandbox: s.sandbox, Branch: target})
}

func (s *selfService) Output(ctx context.Context, req *shimv1.SelfOutputRequest) (_ *shimv1.OutputResponse, retErr error) {
	defer func() { retErr = s.hostless(toTTRPC(retErr)) }()
	target, err := s.resolve(ctx, req.Branch)
	if err != nil {
		return nil, err
	}
	return s.c.Output(ctx, &shimv1.OutputRequest{Sandbox: s.sandbox, Branch: target})
}

// subtree is the caller's branch and its descendants among nodes.
func (s *selfService) subtree(nodes []*shimv1.Branch) map[string]bool {
	parents := map[string]string{}
	for _, n := range nodes {
		if n.Id != branch.RootID {
			parents[n.Id] = n.Parent
		}
	}
	in := map[string]bool{}
	for _, id := range branch.Subtree(s.self, parents) {
		in[id] = true
	}
	return in
}

func (s *selfService) Tree(ctx context.Context, _ *shimv1.SelfTreeRequest) (_ *shimv1.SelfTreeResponse, retErr error) {
	defer func() { retErr = s.hostless(toTTRPC(retErr)) }()
	t, err := s.c.Tree(ctx, &shimv1.TreeRequest{Sandbox: s.sandbox})
	if err != nil {
		return nil, err
	}
	in := s.subtree(t.Nodes)
	resp := &shimv1.SelfTreeResponse{Self: s.self}
	for _, n := range t.Nodes {
		if in[n.Id] {
			resp.Nodes = append(resp.Nodes, hide(n))
		}
	}
	return resp, nil
}

func (s *selfService) Checkpoint(ctx context.Context, req *shimv1.SelfCheckpointRequest) (_ *shimv1.CheckpointResponse, retErr error) {
	defer func() { retErr = s.hostless(toTTRPC(retErr)) }()
	target, err := s.resolve(ctx, req.Branch)
	if err != nil {
		return nil, err
	}
	sb, err := s.c.Sandbox(s.sandbox)
	if err != nil {
		return nil, err
	}
	if err := sb.throttleSelfOne(ctx, "checkpoint"); err != nil {
		return nil, err
	}
	creq := &shimv1.CheckpointRequest{Sandbox: s.sandbox, Branch: target, Name: req.Name, Memory: req.Memory}
	if req.Memory && target == s.self {
		// The caller is among the processes to dump (selfcall.go).
		token, err := s.callLater(ctx, "checkpoint with memory", func(ctx context.Context) (proto.Message, error) {
			return s.c.Checkpoint(withSelfCaller(ctx), creq)
		})
		if err != nil {
			return nil, err
		}
		return &shimv1.CheckpointResponse{Pending: token}, nil
	}
	if req.Memory {
		// A descendant's processes: the caller is not among them.
		ctx = context.WithValue(withSelfFork(ctx), callerApartKey{}, true)
	}
	return s.c.Checkpoint(withSelfCaller(ctx), creq)
}

func (s *selfService) ListCheckpoints(ctx context.Context, _ *shimv1.SelfListCheckpointsRequest) (_ *shimv1.ListCheckpointsResponse, retErr error) {
	defer func() { retErr = s.hostless(toTTRPC(retErr)) }()
	t, err := s.c.Tree(ctx, &shimv1.TreeRequest{Sandbox: s.sandbox})
	if err != nil {
		return nil, err
	}
	in := s.subtree(t.Nodes)
	list, err := s.c.ListCheckpoints(ctx, &shimv1.ListCheckpointsRequest{Sandbox: s.sandbox})
	if err != nil {
		return nil, err
	}
	resp := &shimv1.ListCheckpointsResponse{}
	for _, ck := range list.Checkpoints {
		if in[ck.Branch] {
			resp.Checkpoints = append(resp.Checkpoints, ck)
		}
	}
	return resp, nil
}

// selfCallerKey marks a request made through a branch socket, whose
// errors point at branchctl self's commands rather than the host's.
type selfCallerKey struct{}

func withSelfCaller(ctx context.Context) context.Context {
	return context.WithValue(ctx, selfCallerKey{}, true)
}

func isSelfCaller(ctx context.Context) bool {
	v, _ := ctx.Value(selfCallerKey{}).(bool)
	return v
}

// DeleteCheckpoint deletes a checkpoint of the caller's subtree; another
// branch's is not found, as the listing does not show it.
func (s *selfService) DeleteCheckpoint(ctx context.Context, req *shimv1.SelfDeleteCheckpointRequest) (_ *shimv1.Empty, retErr error) {
	defer func() { retErr = s.hostless(toTTRPC(retErr)) }()
	mine, err := s.ListCheckpoints(ctx, &shimv1.SelfListCheckpointsRequest{})
	if err != nil {
		return nil, err
	}
	for _, ck := range mine.Checkpoints {
		if ck.Name == req.Name {
			return s.c.DeleteCheckpoint(ctx, &shimv1.DeleteCheckpointRequest{Sandbox: s.sandbox, Name: req.Name})
		}
	}
	return nil, fmt.Errorf("delete checkpoint %q: no checkpoint of that name of branch %s or its descendants (branchctl self checkpoint ls): %w", req.Name, s.self, errdefs.ErrNotFound)
}

func (s *selfService) Rollback(ctx context.Context, req *shimv1.SelfRollbackRequest) (_ *shimv1.Empty, retErr error) {
	defer func() { retErr = s.hostless(toTTRPC(retErr)) }()
	target, err := s.resolve(ctx, req.Branch)
	if err != nil {
		return nil, err
	}
	sb, err := s.c.Sandbox(s.sandbox)
	if err != nil {
		return nil, err
	}
	if err := sb.throttleSelfOne(ctx, "rollback"); err != nil {
		return nil, err
	}
	return s.c.Rollback(ctx, &shimv1.RollbackRequest{Sandbox: s.sandbox, Branch: target, Name: req.Name})
}
