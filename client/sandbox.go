//go:build linux

package client

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// criSandboxAnnotation groups a pod's containers into one shim.
const criSandboxAnnotation = "io.kubernetes.cri.sandbox-id"

// SandboxClient drives the branches of one sandbox (a container on
// the runtime io.containerd.branch.v1) through its shim.
type SandboxClient struct {
	ID        string
	Namespace string
	// Created is when the container was created.
	Created time.Time
	// name is what the caller named the sandbox by, where that is not
	// its id (a nerdctl or CRI name, an id prefix).
	name string
	conn *ttrpc.Client
	api  shimv1.BranchesService
	// undoing counts what calls whose callers left still undo
	// (detached): Close waits for it.
	undoing undos
}

// NewSandboxClient finds the shim serving the container name names (see
// ResolveSandbox) in a containerd namespace, as containerd does (the shim's socket address is derived from
// containerd's address, the namespace and the id), after checking through
// containerd's API that the container runs on the branch runtime.
func NewSandboxClient(ctx context.Context, address, namespace, name string) (*SandboxClient, error) {
	namespace = orDefault(namespace)
	ctx = namespaces.WithNamespace(ctx, namespace)
	if sc := dialDirect(ctx, address, namespace, name); sc != nil {
		return sc, nil
	}
	gc, err := dialContainerd(address)
	if err != nil {
		return nil, err
	}
	defer gc.Close()
	sb, err := resolveWith(ctx, gc, address, namespace, name)
	if err != nil {
		return nil, err
	}
	// The listed record is containerd's whole record (runtime and spec
	// included): asking for it again would cost a round trip to containerd
	// on every dial, which each branchctl command pays.
	id, c := sb.ID, sb.container
	rt := "none"
	if c.Runtime != nil {
		rt = c.Runtime.Name
	}
	// A CRI pod on the branch handler is recorded as runc-v2's type (its
	// runtime_path names the branch shim; docs/cri.md): its shim is asked.
	if rt != branch.RuntimeName && rt != criRuntimeType {
		return nil, notBranchRuntime(sandboxLabel(name, id), rt)
	}
	group := id
	if c.Spec != nil {
		var spec struct {
			Annotations map[string]string `json:"annotations"`
		}
		if json.Unmarshal(c.Spec.Value, &spec) == nil && spec.Annotations[criSandboxAnnotation] != "" {
			group = spec.Annotations[criSandboxAnnotation]
		}
	}
	sock, err := shimSocket(ctx, address, group)
	if err != nil {
		return nil, err
	}
	conn, err := net.DialTimeout("unix", strings.TrimPrefix(sock, "unix://"), 5*time.Second)
	if err != nil {
		log.G(ctx).WithError(err).WithField("socket", sock).Debug("dial the sandbox's shim")
		return nil, fmt.Errorf("sandbox %s has no running task (start it: ctr -n %s tasks start %s, or nerdctl start): %w", sandboxLabel(name, id), namespace, id, errdefs.ErrFailedPrecondition)
	}
	tc, api := dialShim(conn)
	sc := &SandboxClient{ID: id, Namespace: namespace, Created: sb.Created, conn: tc, api: api}
	if name != id {
		sc.name = name
	}
	if rt == criRuntimeType {
		if _, err := sc.api.Tree(sc.ctx(ctx), &shimv1.TreeRequest{Sandbox: id}); status.Code(err) == codes.Unimplemented {
			tc.Close()
			return nil, notBranchRuntime(sandboxLabel(name, id), rt+" (runc's shim, not branchbox's)")
		}
	}
	return sc, nil
}

// dialDirect connects to the shim of the sandbox whose id is name without
// containerd: the shim's socket is a function of containerd's address, the
// namespace and the id, and the shim says whether it runs that sandbox
// (Describe). An exact id is what the name resolves to first anyway
// (resolve), so the answer is the same; a name, an id prefix, a container
// of a CRI pod (whose shim is the pod's), a stopped sandbox or a container
// on another runtime (whose shim does not serve Describe) get nil, and
// are resolved through containerd's records, which says why when it
// fails. It saves a containerd connection and a listing of every
// container, about half of what a branchctl command waits for.
func dialDirect(ctx context.Context, address, namespace, name string) *SandboxClient {
	if name == "" {
		return nil
	}
	sock, err := shimSocket(ctx, address, name)
	if err != nil {
		return nil
	}
	conn, err := net.DialTimeout("unix", strings.TrimPrefix(sock, "unix://"), time.Second)
	if err != nil {
		return nil
	}
	tc, api := dialShim(conn)
	sc := &SandboxClient{ID: name, Namespace: namespace, conn: tc, api: api}
	if resp, err := sc.api.Describe(sc.ctx(ctx), &shimv1.DescribeRequest{Sandbox: name}); err != nil || resp.Sandbox != name {
		tc.Close()
		return nil
	}
	return sc
}

// criRuntimeType is the runtime type the CRI handler "branch" records its
// containers with: runc-v2's, with runtime_path naming the branch shim.
const criRuntimeType = "io.containerd.runc.v2"

// sandboxLabel names a sandbox in a message as the user did, with its id
// when they named it otherwise.
func sandboxLabel(name, id string) string {
	if name == id {
		return strconv.Quote(id)
	}
	return fmt.Sprintf("%s (id %s)", strconv.Quote(name), id)
}

func notBranchRuntime(id, rt string) error {
	return fmt.Errorf("container %s runs on runtime %s; branches need %s (run it with --runtime %s --snapshotter branch, or on the CRI runtime handler branch): %w", id, rt, branch.RuntimeName, branch.RuntimeName, errdefs.ErrFailedPrecondition)
}

// Close closes the connection to the shim, once what calls whose callers
// left still undo (a fork's branches, an exec's process) is done.
func (s *SandboxClient) Close() error {
	s.undoing.wait()
	return s.conn.Close()
}

// Done returns a channel that is closed when the connection to the shim
// ends: the shim exited (its sandbox is gone) or Close was called. A
// program that keeps a SandboxClient between calls dials again after it.
func (s *SandboxClient) Done() <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		_ = s.conn.UserOnCloseWait(context.Background())
		close(ch)
	}()
	return ch
}

// ctx is the context of a call to the shim, made once what earlier calls
// whose callers left still undo is done (undos.after).
func (s *SandboxClient) ctx(ctx context.Context) context.Context {
	s.undoing.after(ctx)
	return namespaces.WithNamespace(ctx, s.Namespace)
}

// ForkOptions says how to fork.
type ForkOptions struct {
	// Parent is the branch to fork: "" for the sandbox, or a branch id.
	Parent string
	Count  int
	// Seal is "ro" (default: the parent's rootfs turns read-only) or
	// "freeze" (its processes are frozen as well).
	Seal string
	// Net is "shared" (default: the parent's network namespace) or
	// "isolated" (a new one with only loopback).
	Net string
	// Limits; zero means the parent's.
	Memory int64
	CPUs   float64
	Pids   int64
	// Args, if set, run as each branch's init instead of a waiting init.
	Args []string
	// From names a checkpoint of Parent to fork from instead of its current
	// state; committing such a branch replaces Parent's state with its own.
	From string
	// WithMemory forks Parent's running processes too (a memory fork,
	// docs/memory-fork.md): each branch's processes are restored from one
	// dump of Parent's init and its descendants, and continue from there.
	WithMemory bool
}

// ForkResult is a fork's branches and, for a memory fork, its figures.
type ForkResult struct {
	Branches []BranchInfo    `json:"branches"`
	Memory   *MemoryForkInfo `json:"memory,omitempty"`
}

// MemoryForkInfo is what a memory fork cost: how long the parent's
// processes were stopped for the dump, the dump and the restores as the
// caller waited for them, and the size of the memory image.
type MemoryForkInfo struct {
	Pause      time.Duration `json:"pause"`
	Dump       time.Duration `json:"dump"`
	Restore    time.Duration `json:"restore"`
	ImageBytes int64         `json:"imageBytes"`
}

// BranchInfo is one branch of a sandbox's tree: the sandbox itself (ID
// "0", the root) or a branch forked from it.
type BranchInfo struct {
	// Node carries the tree's view: id, parent, state, epochs, times and,
	// for a stale branch, the winner.
	branch.Node
	UpperSize   int64    `json:"upperSize"`
	UpperInodes int64    `json:"upperInodes"`
	Sealed      bool     `json:"sealed"`
	Seal        string   `json:"seal,omitempty"`
	Children    []string `json:"children,omitempty"`
	InitPid     int      `json:"initPid,omitempty"`
	Pids        []int    `json:"pids,omitempty"`
	// Status: "waiting" (its init holds it), "running" (a command runs as
	// its init), "exited", "frozen", "paused" (the sandbox is paused, and
	// its branches with it); empty for ended branches.
	Status     string  `json:"status,omitempty"`
	ExitStatus int     `json:"exitStatus,omitempty"`
	OOMKilled  bool    `json:"oomKilled,omitempty"`
	Net        string  `json:"net,omitempty"`
	Memory     int64   `json:"memory,omitempty"`
	CPUs       float64 `json:"cpus,omitempty"`
	PidsLimit  int64   `json:"pidsLimit,omitempty"`
	Cgroup     string  `json:"cgroup,omitempty"`
	// Quarantine, on the root of a sandbox whose branch tree the
	// snapshotter could not recover, says why; branch operations on the
	// sandbox are refused until a retry succeeds.
	Quarantine string `json:"quarantine,omitempty"`
	// MemoryFork: its processes were restored from a memory fork.
	MemoryFork bool `json:"memoryFork,omitempty"`
}

// ContextInfo is BranchInfo's old name, kept so that code written against
// it still builds until the release after next (docs/design.md#names).
//
// Deprecated: use BranchInfo.
type ContextInfo = BranchInfo

func branchFromProto(c *shimv1.Branch) BranchInfo {
	if c == nil {
		return BranchInfo{}
	}
	i := BranchInfo{
		Node: branch.Node{
			ID: c.Id, Parent: c.Parent, State: branch.State(c.State), Epoch: c.Epoch, ForkEpoch: c.ForkEpoch,
			Winner: c.Winner, WinnerEpoch: c.WinnerEpoch,
		},
		UpperSize: c.UpperSize, UpperInodes: c.UpperInodes,
		Sealed: c.Sealed, Seal: c.Seal, Children: c.Children, InitPid: int(c.InitPid), Status: c.Status,
		ExitStatus: int(c.ExitStatus), OOMKilled: c.OomKilled, Net: c.Net, Cgroup: c.Cgroup,
		Quarantine: c.Quarantine, MemoryFork: c.Memory,
	}
	for _, p := range c.Pids {
		i.Pids = append(i.Pids, int(p))
	}
	if c.Created != nil {
		i.Created = c.Created.AsTime()
	}
	if c.Ended != nil {
		i.Ended = c.Ended.AsTime()
	}
	if l := c.Limits; l != nil {
		i.Memory, i.CPUs, i.PidsLimit = l.Memory, l.Cpus, l.Pids
	}
	return i
}

func branchesFromProto(list []*shimv1.Branch) []BranchInfo {
	out := make([]BranchInfo, len(list))
	for i, c := range list {
		out[i] = branchFromProto(c)
	}
	return out
}

// Fork makes opts.Count branches of opts.Parent, each with its own
// copy-on-write rootfs, cgroup, PID and mount namespace and a running init.
// If ctx ends before the answer, Fork returns at once with ctx's error and
// the branches the shim makes all the same are aborted.
func (s *SandboxClient) Fork(ctx context.Context, opts ForkOptions) ([]BranchInfo, error) {
	res, err := s.ForkResult(ctx, opts)
	return res.Branches, err
}

// ForkResult is Fork, with a memory fork's figures.
func (s *SandboxClient) ForkResult(ctx context.Context, opts ForkOptions) (ForkResult, error) {
	if err := checkCount(opts.Count); err != nil {
		return ForkResult{}, err
	}
	req := &shimv1.ForkRequest{
		Sandbox: s.ID, Parent: opts.Parent, Count: uint32(opts.Count), Seal: opts.Seal, Net: opts.Net,
		Limits: &shimv1.Limits{Memory: opts.Memory, Cpus: opts.CPUs, Pids: opts.Pids}, Args: opts.Args,
		FromCheckpoint: opts.From, Memory: opts.WithMemory,
	}
	resp, err := detached(ctx, &s.undoing, "fork of "+s.ID, forkBound, func(ctx context.Context) (*shimv1.ForkResponse, error) {
		resp, err := s.api.Fork(s.ctx(ctx), req)
		return resp, s.shimErr(err)
	}, abortOrphans("fork of "+s.ID, s.Abort))
	if err != nil {
		return ForkResult{}, err
	}
	res := ForkResult{Branches: branchesFromProto(resp.Branches)}
	if m := resp.Memory; m != nil {
		res.Memory = &MemoryForkInfo{Pause: time.Duration(m.PauseNs), Dump: time.Duration(m.DumpNs), Restore: time.Duration(m.RestoreNs), ImageBytes: m.ImageBytes}
	}
	return res, nil
}

// forkBound bounds a fork once its caller has left (detached).
const forkBound = 5 * time.Minute

// checkCount refuses a fork count that is not positive or does not fit the
// wire's 32 bits (it would wrap: 4294967297 would fork one). The shim
// bounds it further.
func checkCount(n int) error {
	if n < 1 || int64(n) > math.MaxUint32 {
		return fmt.Errorf("fork: count %d: give at least 1 (and at most the sandbox's maximum of live branches, 64 unless set): %w", n, errdefs.ErrInvalidArgument)
	}
	return nil
}

// SandboxCommitResult is the parent after a commit, and the branches the
// commit invalidated (their processes killed, their layers discarded).
type SandboxCommitResult struct {
	Parent      BranchInfo `json:"parent"`
	Invalidated []string   `json:"invalidated"`
}

// Commit makes a leaf branch's changes its parent's, visible at once to the
// parent's running processes. The first commit into a parent wins; a loser
// gets a *StaleError naming the winner.
func (s *SandboxClient) Commit(ctx context.Context, branchID string) (SandboxCommitResult, error) {
	resp, err := s.api.Commit(s.ctx(ctx), &shimv1.CommitRequest{Sandbox: s.ID, Branch: branchID})
	if err != nil {
		return SandboxCommitResult{}, s.shimErr(err)
	}
	return SandboxCommitResult{Parent: branchFromProto(resp.Parent), Invalidated: resp.Invalidated}, nil
}

// Abort kills and discards a branch and its descendants.
func (s *SandboxClient) Abort(ctx context.Context, branchID string) ([]string, error) {
	resp, err := s.api.Abort(s.ctx(ctx), &shimv1.AbortRequest{Sandbox: s.ID, Branch: branchID})
	if err != nil {
		return nil, s.shimErr(err)
	}
	return resp.Aborted, nil
}

// Output returns what a branch's command (ForkOptions.Args), or a memory
// branch's restored processes, wrote to stdout and stderr: the last 1 to
// 2 MiB of it, kept by the shim until the branch ends. A branch with
// neither has none.
func (s *SandboxClient) Output(ctx context.Context, branchID string) ([]byte, error) {
	resp, err := s.api.Output(s.ctx(ctx), &shimv1.OutputRequest{Sandbox: s.ID, Branch: branchID})
	if err != nil {
		return nil, s.shimErr(err)
	}
	return resp.Output, nil
}

// Tree lists every branch of the sandbox, ended ones included.
func (s *SandboxClient) Tree(ctx context.Context) ([]BranchInfo, error) {
	resp, err := s.api.Tree(s.ctx(ctx), &shimv1.TreeRequest{Sandbox: s.ID})
	if err != nil {
		return nil, s.shimErr(err)
	}
	return branchesFromProto(resp.Nodes), nil
}

// fromTTRPC restores errdefs kinds and stale errors; the shim sends them as
// the snapshotter does.
func fromTTRPC(err error) error {
	if err == nil {
		return nil
	}
	return branch.FromGRPC(err)
}
