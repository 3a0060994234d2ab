//go:build linux

package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/proto"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// SelfClient drives the caller's own branch from inside a sandbox:
// fork it, run in and wait for what it forked, commit or abort itself or
// its descendants. Its socket reaches only its own branch and the
// branches forked from it.
type SelfClient struct {
	path string
	conn *ttrpc.Client
	api  shimv1.SelfService
	// undoing counts what calls whose callers left still undo
	// (detached): Close waits for it.
	undoing undos
}

// DialSelf connects to the branch socket at path; "" means $BRANCHBOX_SOCKET,
// or else SelfSocket.
func DialSelf(ctx context.Context, path string) (*SelfClient, error) {
	if path == "" {
		path = os.Getenv(branch.SelfSocketEnv)
	}
	if path == "" {
		path = branch.SelfSocket
	}
	s := &SelfClient{path: path}
	if err := s.dial(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// dial connects to the socket at s.path.
func (s *SelfClient) dial(ctx context.Context) error {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := d.DialContext(dctx, "unix", s.path)
	if err != nil {
		if _, serr := os.Stat(s.path); serr != nil {
			return fmt.Errorf("no branch socket at %s: run the sandbox with the annotation io.branchbox.socket=true (and runtime io.containerd.branch.v1, snapshotter branch): %w", s.path, errdefs.ErrNotFound)
		}
		return fmt.Errorf("connect to the branch socket %s: %v: %w", s.path, err, errdefs.ErrUnavailable)
	}
	s.conn = ttrpc.NewClient(conn, ttrpc.WithChainUnaryClientInterceptor(s.ordered, hungUp))
	s.api = shimv1.NewSelfClient(s.conn)
	return nil
}

// ordered sends a call once what earlier calls whose callers left still
// undo is done (undos.after), as a SandboxClient does.
func (s *SelfClient) ordered(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, _ *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
	s.undoing.after(ctx)
	return invoke(ctx, req, resp)
}

// hungUp refuses a request larger than a branch socket takes (the shim
// would hang up at its header), and words a call the shim hung up on,
// which ttrpc reports as "ttrpc: closed": the shim closes a connection at
// once when the sandbox already has its maximum open (docs/limits.md),
// and every connection to a branch's socket when the branch ends.
func hungUp(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, _ *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
	if n := proto.Size(req); n > branch.SelfRequestMax {
		return fmt.Errorf("%s: a request of %d bytes, more than the %d a branch socket takes: pass large input through a file in the branch: %w", req.Method, n, branch.SelfRequestMax, errdefs.ErrInvalidArgument)
	}
	err := invoke(ctx, req, resp)
	if errors.Is(err, ttrpc.ErrClosed) {
		return fmt.Errorf("the shim hung up on the branch socket: the sandbox has its maximum of connections open to its branch sockets (processes holding them: close some), or this branch has ended: %w", errdefs.ErrUnavailable)
	}
	return err
}

// Close closes the connection, once what calls whose callers left still
// undo (a fork's branches, an exec's process) is done.
func (s *SelfClient) Close() error {
	s.undoing.wait()
	return s.conn.Close()
}

// Fork makes opts.Count children of opts.Parent ("" for the caller's own
// branch, else a descendant of it).
func (s *SelfClient) Fork(ctx context.Context, opts ForkOptions) ([]BranchInfo, error) {
	if err := checkCount(opts.Count); err != nil {
		return nil, err
	}
	req := &shimv1.SelfForkRequest{
		Parent: opts.Parent, Count: uint32(opts.Count), Seal: opts.Seal, Net: opts.Net,
		Limits: &shimv1.Limits{Memory: opts.Memory, Cpus: opts.CPUs, Pids: opts.Pids}, Args: opts.Args,
		FromCheckpoint: opts.From, Memory: opts.WithMemory,
	}
	resp, err := detached(ctx, &s.undoing, "fork", forkBound, func(ctx context.Context) (*shimv1.ForkResponse, error) {
		resp, err := s.api.Fork(ctx, req)
		return resp, fromTTRPC(err)
	}, abortOrphans("fork", s.Abort))
	if err != nil {
		return nil, err
	}
	if token := resp.Pending; token != "" {
		// A memory fork of the caller's own branch (selfcall.go): in
		// each copy of the caller, no branches.
		resp = &shimv1.ForkResponse{}
		if copied, err := s.awaitSelfCall(ctx, token, resp); err != nil || copied {
			return []BranchInfo{}, err
		}
	}
	return branchesFromProto(resp.Branches), nil
}

// SelfResult is how a process started through the socket ended, and the
// end of its output (up to the last 1 MiB of each stream, less when the
// sandbox's processes not waited for hold more than its budget:
// docs/limits.md); Truncated says output was dropped.
type SelfResult struct {
	ExitStatus
	Stdout    []byte `json:"stdout"`
	Stderr    []byte `json:"stderr"`
	Truncated bool   `json:"truncated,omitempty"`
}

// SelfExecOptions describes a process to start in a descendant.
type SelfExecOptions struct {
	Args []string
	Env  []string
	Cwd  string
}

// Exec starts a process in branch (a descendant of the caller's branch, or
// "" for the caller's own branch) and returns its id for Wait. It has no
// standard input; the shim keeps its output for Wait.
func (s *SelfClient) Exec(ctx context.Context, branchID string, opts SelfExecOptions) (string, error) {
	req := &shimv1.SelfExecRequest{Branch: branchID, Args: opts.Args, Env: opts.Env, Cwd: opts.Cwd}
	what := fmt.Sprintf("exec in branch %q", branchID)
	resp, err := detached(ctx, &s.undoing, what, execStartBound, func(ctx context.Context) (*shimv1.SelfExecResponse, error) {
		resp, err := s.api.Exec(ctx, req)
		return resp, fromTTRPC(err)
	}, func(ctx context.Context, resp *shimv1.SelfExecResponse, err error) {
		if err == nil {
			s.end(ctx, branchID, resp.ExecId)
		}
	})
	if err != nil {
		return "", err
	}
	return resp.ExecId, nil
}

// Wait waits for a process started by Exec.
func (s *SelfClient) Wait(ctx context.Context, branchID, execID string) (SelfResult, error) {
	resp, err := s.api.Wait(ctx, &shimv1.SelfWaitRequest{Branch: branchID, ExecId: execID})
	if err != nil {
		return SelfResult{}, fromTTRPC(err)
	}
	r := SelfResult{ExitStatus: ExitStatus{Code: int(resp.ExitStatus), OOMKilled: resp.OomKilled, BranchEnded: resp.BranchEnded},
		Stdout: resp.Stdout, Stderr: resp.Stderr, Truncated: resp.Truncated}
	if resp.ExitedAt != nil {
		r.ExitedAt = resp.ExitedAt.AsTime()
	}
	return r, nil
}

// Run starts a process in branch and waits for it; if ctx ends first,
// the process and its session are killed, as SandboxClient.Run.
func (s *SelfClient) Run(ctx context.Context, branchID string, opts SelfExecOptions) (SelfResult, error) {
	id, err := s.Exec(ctx, branchID, opts)
	if err != nil {
		return SelfResult{}, err
	}
	res, err := s.Wait(ctx, branchID, id)
	if cause := runCut(ctx, err); cause != nil {
		// As SandboxClient.Run: the process and its session go.
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killBound)
		defer cancel()
		s.end(kctx, branchID, id)
		return SelfResult{}, fmt.Errorf("run %v in branch %q: %w", opts.Args, branchID, cause)
	}
	return res, err
}

// end kills exec execID of a branch and its session and waits for it (the
// shim then forgets it): for one whose caller left (Exec, Run).
func (s *SelfClient) end(ctx context.Context, branchID, execID string) {
	_ = s.KillAll(ctx, branchID, execID, uint32(syscall.SIGKILL))
	_, _ = s.Wait(ctx, branchID, execID)
}

// KillAll signals a process started by Exec and what it started (its
// session, as Process.KillAll), those it left running after its exit too.
func (s *SelfClient) KillAll(ctx context.Context, branchID, execID string, sig uint32) error {
	_, err := s.api.Kill(ctx, &shimv1.SelfKillRequest{Branch: branchID, ExecId: execID, Signal: sig, All: true})
	return fromTTRPC(err)
}

// Kill signals a process started by Exec.
func (s *SelfClient) Kill(ctx context.Context, branchID, execID string, sig uint32) error {
	_, err := s.api.Kill(ctx, &shimv1.SelfKillRequest{Branch: branchID, ExecId: execID, Signal: sig})
	return fromTTRPC(err)
}

// Commit makes a leaf's changes its parent's (first commit wins). With
// branch "" it commits the caller's own branch: that kills every process
// of the branch, the caller included, so like exec(2) it returns only on
// failure (the parent sees the outcome: the changes, and the tree).
func (s *SelfClient) Commit(ctx context.Context, branchID string) (SandboxCommitResult, error) {
	resp, err := s.api.Commit(ctx, &shimv1.SelfCommitRequest{Branch: branchID})
	if err != nil {
		return SandboxCommitResult{}, fromTTRPC(err)
	}
	return SandboxCommitResult{Parent: branchFromProto(resp.Parent), Invalidated: resp.Invalidated}, nil
}

// Abort kills and discards branch and its descendants; with "" the
// caller's own branch, which like Commit returns only on failure.
func (s *SelfClient) Abort(ctx context.Context, branchID string) ([]string, error) {
	resp, err := s.api.Abort(ctx, &shimv1.SelfAbortRequest{Branch: branchID})
	if err != nil {
		return nil, fromTTRPC(err)
	}
	return resp.Aborted, nil
}

// Output returns what branch's command (or a memory branch's processes)
// wrote: the last 1 to 2 MiB of it; with "" the caller's own branch.
func (s *SelfClient) Output(ctx context.Context, branchID string) ([]byte, error) {
	resp, err := s.api.Output(ctx, &shimv1.SelfOutputRequest{Branch: branchID})
	if err != nil {
		return nil, fromTTRPC(err)
	}
	return resp.Output, nil
}

// Tree returns the caller's branch id and that branch with its
// descendants (ended ones too). Host pids and cgroup paths are left out.
func (s *SelfClient) Tree(ctx context.Context) (string, []BranchInfo, error) {
	resp, err := s.api.Tree(ctx, &shimv1.SelfTreeRequest{})
	if err != nil {
		return "", nil, fromTTRPC(err)
	}
	return resp.Self, branchesFromProto(resp.Nodes), nil
}

// Checkpoint records the state of branch ("" for the caller's branch).
// With CheckpointWithMemory of the caller's own branch the caller is
// dumped too, and the call returns again in each copy of it restored from
// the checkpoint later (fork --from NAME --memory, a rollback of a memory
// branch to it), there with a zero Checkpoint, as setjmp returns again
// after a longjmp.
func (s *SelfClient) Checkpoint(ctx context.Context, branchID, name string, opts ...CheckpointOption) (branch.Checkpoint, error) {
	var creq shimv1.CheckpointRequest
	for _, o := range opts {
		o(&creq)
	}
	req := &shimv1.SelfCheckpointRequest{Branch: branchID, Name: name, Memory: creq.Memory}
	// As SandboxClient.Checkpoint: an error of ctx means not kept.
	what := fmt.Sprintf("checkpoint %q", name)
	resp, err := detached(ctx, &s.undoing, what, checkpointBound, func(ctx context.Context) (*shimv1.CheckpointResponse, error) {
		resp, err := s.api.Checkpoint(ctx, req)
		return resp, fromTTRPC(err)
	}, deleteOrphan(what, name, s.DeleteCheckpoint))
	if err != nil {
		return branch.Checkpoint{}, err
	}
	if token := resp.Pending; token != "" {
		resp = &shimv1.CheckpointResponse{}
		if copied, err := s.awaitSelfCall(ctx, token, resp); err != nil || copied {
			return branch.Checkpoint{}, err
		}
	}
	return branch.CheckpointFromProto(resp.Checkpoint), nil
}

// Checkpoints lists the checkpoints of the caller's branch and its
// descendants.
func (s *SelfClient) Checkpoints(ctx context.Context) ([]branch.Checkpoint, error) {
	resp, err := s.api.ListCheckpoints(ctx, &shimv1.SelfListCheckpointsRequest{})
	if err != nil {
		return nil, fromTTRPC(err)
	}
	out := make([]branch.Checkpoint, len(resp.Checkpoints))
	for i, c := range resp.Checkpoints {
		out[i] = branch.CheckpointFromProto(c)
	}
	return out, nil
}

// DeleteCheckpoint deletes a checkpoint of the caller's branch or of a
// descendant.
func (s *SelfClient) DeleteCheckpoint(ctx context.Context, name string) error {
	_, err := s.api.DeleteCheckpoint(ctx, &shimv1.SelfDeleteCheckpointRequest{Name: name})
	return fromTTRPC(err)
}

// Rollback brings branch ("" for the caller's branch) back to a checkpoint
// of its own.
func (s *SelfClient) Rollback(ctx context.Context, branchID, name string) error {
	_, err := s.api.Rollback(ctx, &shimv1.SelfRollbackRequest{Branch: branchID, Name: name})
	return fromTTRPC(err)
}
