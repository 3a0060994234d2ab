//go:build linux

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/branchbox/branchbox/client/branchapi"
	"github.com/branchbox/branchbox/shim/brinit"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/initdriver"

	"github.com/containerd/console"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// The branch contexts' ttrpc API (shimv1.Contexts): fork, commit, abort, exec
// and its process calls, tree.

// Fork makes branch contexts, each with its init running (waiting, or the
// given command), and seals the parent.
func (c *Service) Fork(ctx context.Context, req *shimv1.ForkRequest) (_ *shimv1.ForkResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	if req.Count < 1 || req.Count > 1024 {
		return nil, fmt.Errorf("fork: count must be 1 to 1024, got %d: %w", req.Count, errdefs.ErrInvalidArgument)
	}
	switch req.Seal {
	case "":
		req.Seal = SealReadOnly
	case SealReadOnly, SealFreeze:
	default:
		return nil, fmt.Errorf("fork: seal %q: want %q or %q: %w", req.Seal, SealReadOnly, SealFreeze, errdefs.ErrInvalidArgument)
	}
	switch req.Net {
	case "":
		req.Net = NetShared
	case NetShared, NetIsolated:
	default:
		return nil, fmt.Errorf("fork: net %q: want %q or %q: %w", req.Net, NetShared, NetIsolated, errdefs.ErrInvalidArgument)
	}
	if err := checkLimits(req.Limits); err != nil {
		return nil, err
	}
	sb, err := c.Sandbox(req.Sandbox)
	if err != nil {
		return nil, err
	}
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := c.load(ctx, sb); err != nil {
		return nil, err
	}
	parentID := req.Parent
	if parentID == "" {
		parentID = branch.RootID
	}
	parent, ok := sb.nodes[parentID]
	if !ok {
		// Let the snapshotter say what became of it (stale, committed...).
		if _, err := sb.snapshot.Mounts(ctx, sb.ref(parentID)); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("branch %s of %s has no running context: %w", parentID, sb.id, errdefs.ErrNotFound)
	}
	if parent.held {
		return nil, fmt.Errorf("fork %s of %s: it is frozen until the snapshotter answers and says whether its commit was made; call commit again to learn it: %w", parentID, sb.id, errdefs.ErrFailedPrecondition)
	}
	if err := sb.checkBranches(parent, int(req.Count)); err != nil {
		return nil, err
	}
	pid, err := c.initPid(ctx, sb, parent)
	if err != nil {
		return nil, err
	}
	var img *memoryImage
	if req.Memory {
		if err := c.checkMemoryFork(ctx, sb, parent, pid, req); err != nil {
			return nil, err
		}
		if req.FromCheckpoint != "" {
			if img, err = c.checkpointImage(ctx, sb, parent, req.FromCheckpoint); err != nil {
				return nil, err
			}
			defer img.remove(context.WithoutCancel(ctx))
		}
	}
	ms, _ := c.hier()
	// A memory branch is restored by the runtime, not the branch init.
	runtimePath := req.Memory || c.inits.Binary == "" || initdriver.Unsupported(parent.spec) != ""
	if err := c.pidsRoom(sb, parent, ms, runtimePath, req); err != nil {
		return nil, err
	}
	join := joinNS{user: fmt.Sprintf("/proc/%d/ns/user", pid)}
	if req.Net == NetShared {
		join.net = fmt.Sprintf("/proc/%d/ns/net", pid)
	}
	// Inits started ahead are taken now, their cgroups renamed to the
	// names the next branch ids give while the snapshotter makes the
	// branches; each start claims its own (start).
	var aheads []*initdriver.Ahead
	if !runtimePath && parentID == branch.RootID && req.Net == NetShared && sb.pool != nil && sb.nextID > 0 {
		for i := range uint64(req.Count) {
			a := sb.pool.TakeAhead(ctx, branchCgroup(parent.cgroup, strconv.FormatUint(sb.nextID+i, 10)))
			if a == nil {
				break
			}
			aheads = append(aheads, a)
		}
	}
	defer func() {
		for _, a := range aheads {
			a.Release(ctx)
		}
	}()
	// The snapshotter's answer is waited for even if the caller gives up
	// meanwhile: branches it made are then undone rather than left live
	// there, sealing the parent, with no context running them.
	sctx, answered := answerCtx(ctx, answerGrace)
	infos, err := c.sealFork(sctx, sb, parent, pid, req)
	answered()
	for _, in := range infos {
		if id, err := strconv.ParseUint(in.ID, 10, 64); err == nil && id >= sb.nextID {
			sb.nextID = id + 1
		}
	}
	if err != nil {
		if ctx.Err() != nil || (errdefs.IsUnavailable(err) && !errors.Is(err, branchapi.ErrNotSent)) {
			// Not answered: what it did there is reconciled.
			wake(sb.kick)
		}
		return nil, err
	}
	made := make([]*bctx, len(infos))
	defer func() {
		if retErr == nil {
			return
		}
		// Undone even if the fork failed because its caller gave up: a
		// branch it leaves would appear later with nobody knowing it.
		ctx := context.WithoutCancel(ctx)
		for i, info := range infos {
			if made[i] != nil {
				c.destroy(ctx, sb, made[i])
			}
			if _, err := sb.snapshot.Abort(ctx, sb.ref(info.ID)); err != nil {
				log.G(ctx).WithError(err).WithField("branch", info.ID).Warn("abort branch of a failed fork")
			}
		}
		c.unsealIfIdle(ctx, sb, parent)
	}()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fork %s of %s: the caller gave up before it was done; undone: %w", parentID, sb.id, err)
	}
	if req.Memory && img == nil {
		// Sealed first: the image and the branches' lower layer are
		// the same instant.
		if img, err = c.dumpMemory(ctx, sb, parent, fmt.Sprintf("memory fork of %s", sb.id)); err != nil {
			return nil, err
		}
		defer img.remove(context.WithoutCancel(ctx))
	}
	for i, a := range aheads {
		if i >= len(infos) || a.Guess != branchCgroup(parent.cgroup, infos[i].ID) {
			// A wrong guess (ids used behind the shim's back): the
			// guessed names may be other branches' of this fork, so
			// every init taken ahead goes, cgroup and all, before any
			// start makes one.
			for _, a := range aheads {
				a.Release(ctx)
			}
			aheads = nil
			break
		}
	}
	if err := cgroup.PrepareBranchParent(ctx, parent.cgroup); err != nil {
		return nil, fmt.Errorf("fork %s of %s: make room for branch cgroups: %w", parentID, sb.id, err)
	}
	errs := make([]error, len(infos))
	var wg sync.WaitGroup
	// Two at a time with the runtime (each start runs a Go binary twice,
	// and more in parallel only queue on the CPUs); four with the branch
	// init, whose starts mostly wait (cgroup moves, mounts).
	par := 2
	if c.inits.Binary != "" {
		par = 4
	}
	if runtimePath && len(cgroup.PidsLimits(ms, parent.cgroup)) > 0 {
		// The runtime moves its init's first process into the cgroup
		// unchecked (a v1 move), then forks from it: one at a time, the
		// room counted up front (pidsRoom) holds for each.
		par = 1
	}
	sem := make(chan struct{}, par)
	restoring := time.Now()
	for i, info := range infos {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var a *initdriver.Ahead
			if i < len(aheads) {
				a = aheads[i]
			}
			made[i], errs[i] = c.start(ctx, sb, parent, info, join, req, a, img)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		slack := int64(0)
		if runtimePath {
			slack = runtimeStartPids
		}
		if pl := cgroup.AsPidsLimit(errs, cgroup.PidsLimits(ms, parent.cgroup), slack); pl != nil {
			// One line, not the runtime's story of each failed start.
			return nil, sb.pidsRefusal(parent, pl)
		}
		return nil, fmt.Errorf("fork %s of %s: %w", parentID, sb.id, err)
	}
	if err := ctx.Err(); err != nil {
		// Its caller is gone and would never learn of these branches:
		// they are undone rather than left to appear unasked.
		return nil, fmt.Errorf("fork %s of %s: the caller gave up before it was done; undone: %w", parentID, sb.id, err)
	}
	if parentID == branch.RootID && req.Net == NetShared && made[0].fast != nil {
		if sb.pool == nil {
			sb.pool = initdriver.NewPool(c.inits, parent.cgroup, brinit.CloneFlags(made[0].spec), initdriver.PrepOf(ctx, made[0].spec))
		}
		sb.pool.Fill(ctx, int(req.Count))
	}
	parent.seal = req.Seal
	if parent.frozen {
		parent.seal = SealFreeze // by request, or for files open for writing
	}
	resp := &shimv1.ForkResponse{}
	if img != nil {
		resp.Memory = &shimv1.MemoryFork{PauseNs: int64(img.pause), DumpNs: int64(img.dump), RestoreNs: int64(time.Since(restoring)), ImageBytes: img.size}
	}
	ids := make([]string, len(made))
	for i, n := range made {
		sb.nodes[n.id] = n
		ids[i] = n.id
		resp.Branches = append(resp.Branches, c.describe(sb, n, &infos[i], n.hasCommand || n.memory))
	}
	c.publish(ctx, TopicFork, &branchEvent{Sandbox: sb.id, Parent: parentID, Branches: ids})
	return resp, nil
}

// Commit freezes the winner, lets the snapshotter apply its changes through
// the parent's live mount (first commit wins), then kills the winner and
// every invalidated branch. The winner is frozen rather than killed before
// the snapshotter decides, so that a commit the snapshotter refuses, or
// never got, leaves it running as it was; one whose outcome is unknown
// (the connection was lost mid-call) stays frozen until the snapshotter
// answers again, and is then killed or thawed as its tree says.
func (c *Service) Commit(ctx context.Context, req *shimv1.CommitRequest) (_ *shimv1.CommitResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	if req.Branch == "" || req.Branch == branch.RootID {
		return nil, fmt.Errorf("name a branch of sandbox %s (SANDBOX/BRANCH), not the sandbox itself: %w", req.Sandbox, errdefs.ErrInvalidArgument)
	}
	sb, err := c.Sandbox(req.Sandbox)
	if err != nil {
		return nil, err
	}
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := c.load(ctx, sb); err != nil {
		return nil, err
	}
	n, ok := sb.nodes[req.Branch]
	if !ok {
		// A retry of a commit whose reply was lost, or one the snapshotter
		// finished after a crash: the tree says what became of it.
		return c.commitOutcome(ctx, sb, req.Branch, nil)
	}
	if kids := sb.descendants(n.id); len(kids) > 0 {
		return nil, fmt.Errorf("commit %s/%s: it has live branches (%s); commit or abort them first: %w", sb.id, n.id, ids(kids), errdefs.ErrFailedPrecondition)
	}
	if !n.held {
		if err := c.hold(ctx, n); err != nil {
			return nil, fmt.Errorf("commit %s/%s: freeze its processes: %w", sb.id, n.id, err)
		}
	}
	if err := ctx.Err(); err != nil {
		// Not sent: the caller gave up while its branch was frozen.
		c.unhold(ctx, n)
		return nil, fmt.Errorf("commit %s/%s: not made, the caller gave up; the branch runs on: %w", sb.id, n.id, err)
	}
	res, err := sb.snapshot.Commit(ctx, sb.ref(n.id))
	if err != nil {
		if errors.Is(err, branchapi.ErrNotSent) {
			// The snapshotter never saw it: the branch runs on.
			c.unhold(ctx, n)
			return nil, fmt.Errorf("commit %s/%s: not made, the branch runs on: %w", sb.id, n.id, err)
		}
		return c.commitOutcome(ctx, sb, n.id, err)
	}
	return c.committed(ctx, sb, n.id, n.parent, res.Invalidated, res.Parent), nil
}

// committed ends a decided commit in the shim: the winner and every
// invalidated branch still running are killed and removed, the parent is
// unsealed if it has no branch left, and the commit is published.
func (c *Service) committed(ctx context.Context, sb *sandbox, winner, parentID string, invalidated []string, parent branch.Info) *shimv1.CommitResponse {
	var gone []*bctx
	for _, id := range append([]string{winner}, invalidated...) {
		if o, ok := sb.nodes[id]; ok {
			gone = append(gone, o)
			delete(sb.nodes, id)
		}
	}
	c.destroyAll(ctx, sb, gone)
	if p, ok := sb.nodes[parentID]; ok {
		c.unsealIfIdle(ctx, sb, p)
	}
	c.publish(ctx, TopicCommit, &branchEvent{Sandbox: sb.id, Parent: parentID, Branches: []string{winner}, Winner: winner, Epoch: parent.Epoch})
	if len(invalidated) > 0 {
		c.publish(ctx, TopicInvalidate, &branchEvent{Sandbox: sb.id, Parent: parentID, Branches: invalidated, Winner: winner, Epoch: parent.Epoch})
	}
	resp := &shimv1.CommitResponse{Invalidated: invalidated}
	if p, ok := sb.nodes[parentID]; ok {
		resp.Parent = c.describe(sb, p, &parent, true)
	}
	return resp
}

// commitOutcome settles a commit of id from the snapshotter's tree, after
// the commit call failed with callErr (its fate unknown), or for a branch
// this shim no longer runs (callErr nil): a commit that was made returns
// its result, one decided but not finished is finished, and one that was
// not made returns why. Every context is reconciled with the tree on the
// way, so the losers of a decided commit die here. If the snapshotter
// cannot say, a held winner stays frozen and the settle loop takes over.
func (c *Service) commitOutcome(ctx context.Context, sb *sandbox, id string, callErr error) (*shimv1.CommitResponse, error) {
	infos, err := sb.snapshot.Tree(ctx, sb.root())
	if err != nil {
		if callErr == nil {
			return nil, fmt.Errorf("commit %s/%s: %w", sb.id, id, err)
		}
		wake(sb.kick)
		return nil, fmt.Errorf("commit %s/%s: outcome unknown (%v); the branch stays frozen until the snapshotter answers, then is killed if the commit was made or thawed if not; call commit again to learn which: %w", sb.id, id, callErr, errdefs.ErrUnavailable)
	}
	finished := c.reconcileWith(ctx, sb, infos)
	if res, ok := finished[id]; ok {
		return c.committed(ctx, sb, id, res.Parent.ID, res.Invalidated, res.Parent), nil
	}
	var info *branch.Info
	for i := range infos {
		if infos[i].ID == id {
			info = &infos[i]
		}
	}
	switch {
	case info != nil && info.State == branch.Committed:
		var invalidated []string
		for _, o := range infos {
			if o.State == branch.Stale && o.Winner == id && o.WinnerEpoch == info.WinnerEpoch {
				invalidated = append(invalidated, o.ID)
			}
		}
		var parent branch.Info
		for _, o := range infos {
			if o.ID == info.Parent {
				parent = o
			}
		}
		return c.committed(ctx, sb, id, info.Parent, invalidated, parent), nil
	case info != nil && info.State == branch.Committing:
		// Decided; reconciling failed to finish it (logged).
		return nil, fmt.Errorf("commit %s/%s: decided, not yet finished (its processes are dead); call commit again to finish it: %w", sb.id, id, errdefs.ErrUnavailable)
	case callErr != nil:
		return nil, fmt.Errorf("commit %s/%s: %w", sb.id, id, callErr)
	case info != nil && info.State == branch.Live:
		return nil, fmt.Errorf("branch %s of %s had no running context here (lost by a crash) and was aborted: %w", id, sb.id, errdefs.ErrNotFound)
	}
	// Let the snapshotter say what became of it (stale, aborted...).
	if _, err := sb.snapshot.Mounts(ctx, sb.ref(id)); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("branch %s of %s has no running context: %w", id, sb.id, errdefs.ErrNotFound)
}

// Abort kills and discards a branch and its descendants.
func (c *Service) Abort(ctx context.Context, req *shimv1.AbortRequest) (_ *shimv1.AbortResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	sb, n, err := c.branchFor(ctx, req.Sandbox, req.Branch, true, true)
	if err != nil {
		return nil, err
	}
	ctx = withNS(ctx, sb)
	defer sb.mu.Unlock()
	gone := append(sb.descendants(n.id), n)
	for _, d := range gone {
		delete(sb.nodes, d.id)
	}
	c.destroyAll(ctx, sb, gone)
	aborted, err := sb.snapshot.Abort(ctx, sb.ref(n.id))
	if err != nil {
		// Its processes are dead and it is forgotten here; the snapshotter
		// may still hold it, and the next reconciliation aborts it there.
		wake(sb.kick)
		return nil, fmt.Errorf("abort %s/%s (its processes were killed; the snapshotter discards it once it answers): %w", sb.id, n.id, err)
	}
	if p, ok := sb.nodes[n.parent]; ok {
		c.unsealIfIdle(ctx, sb, p)
	}
	c.publish(ctx, TopicAbort, &branchEvent{Sandbox: sb.id, Parent: n.parent, Branches: aborted})
	return &shimv1.AbortResponse{Aborted: aborted}, nil
}

// branchFor finds a running branch context; with lock, it returns with the
// sandbox locked. A branch that is not running gets the snapshotter's word
// on what became of it (stale, naming the winner; committed; aborted).
// With write, the operation needs the branch's processes, and a paused
// sandbox is refused (see load).
func (c *Service) branchFor(ctx context.Context, sandboxID, id string, lock, write bool) (*sandbox, *bctx, error) {
	if id == "" || id == branch.RootID {
		return nil, nil, fmt.Errorf("name a branch of sandbox %s (SANDBOX/BRANCH), not the sandbox itself: %w", sandboxID, errdefs.ErrInvalidArgument)
	}
	sb, err := c.Sandbox(sandboxID)
	if err != nil {
		return nil, nil, err
	}
	sb.mu.Lock()
	load := c.view
	if write {
		load = c.load
	}
	if err := load(withNS(ctx, sb), sb); err != nil {
		sb.mu.Unlock()
		return nil, nil, err
	}
	n, ok := sb.nodes[id]
	if !ok {
		_, err := sb.snapshot.Mounts(withNS(ctx, sb), sb.ref(id))
		if err == nil {
			// Live there, unknown here: a mismatch, which reconciling
			// settles (it aborts the branch).
			if rerr := c.reconcile(withNS(ctx, sb), sb); rerr != nil {
				log.G(ctx).WithError(rerr).WithField("sandbox", sb.id).Warn("reconcile branch contexts with the snapshotter")
			}
			err = fmt.Errorf("branch %s of %s had no running context here (lost by a crash, or made outside this shim) and was aborted: %w", id, sandboxID, errdefs.ErrNotFound)
		}
		sb.mu.Unlock()
		return nil, nil, err
	}
	if !lock {
		sb.mu.Unlock()
	}
	return sb, n, nil
}

// Exec starts a process in a branch context.
func (c *Service) Exec(ctx context.Context, req *shimv1.ExecRequest) (_ *shimv1.ExecResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	if len(req.Args) == 0 {
		return nil, fmt.Errorf("exec: no command given: %w", errdefs.ErrInvalidArgument)
	}
	if req.ExecId == "" {
		return nil, fmt.Errorf("exec: no exec id given: %w", errdefs.ErrInvalidArgument)
	}
	sb, n, err := c.branchFor(ctx, req.Sandbox, req.Branch, true, true)
	if err != nil {
		return nil, err
	}
	ctx = withNS(ctx, sb)
	if n.exited {
		sb.mu.Unlock()
		return nil, fmt.Errorf("exec in %s/%s: its command exited, so its namespaces are gone; abort it or fork again: %w", sb.id, n.id, errdefs.ErrFailedPrecondition)
	}
	if n.held {
		sb.mu.Unlock()
		return nil, fmt.Errorf("exec in %s/%s: it is frozen until the snapshotter answers and says whether its commit was made; call commit again to learn it: %w", sb.id, n.id, errdefs.ErrFailedPrecondition)
	}
	if n.frozen && n.fast != nil {
		// Its init, which starts its processes, is frozen with the rest:
		// the request would wait for the thaw, and run after its caller
		// gave up.
		sb.mu.Unlock()
		return nil, fmt.Errorf("exec in %s/%s: its processes are frozen while it has branches (forked with --seal freeze); commit or abort its branches first: %w", sb.id, n.id, errdefs.ErrFailedPrecondition)
	}
	ps := *n.spec.Process
	ps.Args = req.Args
	ps.Env = append(append([]string{}, ps.Env...), req.Env...)
	if req.Cwd != "" {
		ps.Cwd = req.Cwd
	}
	ps.Terminal = req.Terminal
	// The process starts outside the sandbox's lock; a Pause waits for it,
	// as a process starting in a frozen branch would wait for the resume.
	sb.starting.add()
	defer sb.starting.done()
	if fc := n.fast; fc != nil {
		sb.mu.Unlock()
		p, err := fc.Exec(ctx, req.ExecId, &ps, req.Stdin, req.Stdout, req.Stderr)
		if err != nil {
			return nil, fmt.Errorf("exec %v in %s/%s: %w", req.Args, sb.id, n.id, err)
		}
		return &shimv1.ExecResponse{Pid: uint32(p.Pid())}, nil
	}
	b, err := json.Marshal(&ps)
	if err != nil {
		sb.mu.Unlock()
		return nil, err
	}
	container := n.container
	// The sandbox stays unlocked while the process starts: a commit waits
	// only for the bookkeeping, and kills what it finds in the cgroup.
	ok, cancel := container.ReserveProcess(req.ExecId)
	sb.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("exec id %s already used in %s/%s: %w", req.ExecId, sb.id, n.id, errdefs.ErrAlreadyExists)
	}
	p, err := container.Exec(ctx, &taskAPI.ExecProcessRequest{
		ID: n.runtimeID, ExecID: req.ExecId, Terminal: req.Terminal,
		Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr,
		Spec: &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/Process", Value: b},
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("exec in %s/%s: %w", sb.id, n.id, errgrpc.ToNative(err))
	}
	cancel()
	started := time.Now()
	if err := p.Start(ctx); err != nil {
		container.ProcessRemove(req.ExecId)
		return nil, fmt.Errorf("exec %v in %s/%s: %w", req.Args, sb.id, n.id, errgrpc.ToNative(err))
	}
	c.watch(p, started)
	return &shimv1.ExecResponse{Pid: uint32(p.Pid())}, nil
}

// proc finds an exec'd process ("" is the branch's init); with write
// (a signal), not in a paused sandbox.
// The returned remove forgets an exec'd process once it is waited for.
func (c *Service) proc(ctx context.Context, sandboxID, id, execID string, write bool) (*bctx, func(string), process.Process, error) {
	sb, n, err := c.branchFor(ctx, sandboxID, id, true, write)
	if err != nil {
		return nil, nil, nil, err
	}
	procs := n.procs()
	var remove func(string)
	switch {
	case n.fast != nil:
		remove = n.fast.Remove
	case n.container != nil:
		remove = n.container.ProcessRemove
	}
	sb.mu.Unlock()
	if procs == nil {
		return nil, nil, nil, fmt.Errorf("branch %s of %s is gone: %w", id, sandboxID, errdefs.ErrNotFound)
	}
	p, err := procs.Process(execID)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("process %q of %s/%s: %w", execID, sandboxID, id, errdefs.ErrNotFound)
	}
	return n, remove, p, nil
}

// Wait waits for an exec'd process to exit and reports whether the kernel's
// OOM killer ended it.
func (c *Service) Wait(ctx context.Context, req *shimv1.WaitRequest) (_ *shimv1.WaitResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	n, remove, p, err := c.proc(ctx, req.Sandbox, req.Branch, req.ExecId, false)
	if err != nil {
		if sb, serr := c.Sandbox(req.Sandbox); serr == nil && req.ExecId != "" {
			if p := sb.takeEnded(req.Branch, req.ExecId); p != nil {
				// Its branch ended (and killed it) before this Wait came.
				if err := p.Wait(ctx); err != nil {
					return nil, err
				}
				return &shimv1.WaitResponse{ExitStatus: uint32(p.ExitStatus()), ExitedAt: timestamppb.New(p.ExitedAt())}, nil
			}
		}
		return nil, err
	}
	if err := p.Wait(ctx); err != nil {
		return nil, err
	}
	status := p.ExitStatus()
	resp := &shimv1.WaitResponse{ExitStatus: uint32(status), ExitedAt: timestamppb.New(p.ExitedAt())}
	// SIGKILL with OOM kills counted in the branch's memory cgroup.
	if status == 128+int(unix.SIGKILL) {
		if ms, err := c.hier(); err == nil {
			resp.OomKilled = cgroup.OOMKillsIn(cgroup.DirsIn(ms, n.cgroup)) > 0
		}
	}
	if req.ExecId != "" {
		_ = p.Delete(ctx)
		remove(req.ExecId)
	}
	return resp, nil
}

func (c *Service) ResizePty(ctx context.Context, req *shimv1.ResizePtyRequest) (_ *shimv1.Empty, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	_, _, p, err := c.proc(ctx, req.Sandbox, req.Branch, req.ExecId, false)
	if err != nil {
		return nil, err
	}
	if err := p.Resize(console.WinSize{Width: uint16(req.Width), Height: uint16(req.Height)}); err != nil {
		return nil, err
	}
	return &shimv1.Empty{}, nil
}

func (c *Service) CloseIO(ctx context.Context, req *shimv1.CloseIORequest) (_ *shimv1.Empty, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	_, _, p, err := c.proc(ctx, req.Sandbox, req.Branch, req.ExecId, false)
	if err != nil {
		return nil, err
	}
	if stdin := p.Stdin(); stdin != nil {
		if err := stdin.Close(); err != nil {
			return nil, fmt.Errorf("close stdin: %w", err)
		}
	}
	return &shimv1.Empty{}, nil
}

func (c *Service) Kill(ctx context.Context, req *shimv1.KillRequest) (_ *shimv1.Empty, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	if err := checkSignal(req.Signal); err != nil {
		return nil, err
	}
	_, _, p, err := c.proc(ctx, req.Sandbox, req.Branch, req.ExecId, true)
	if err != nil {
		return nil, err
	}
	if err := p.Kill(ctx, req.Signal, false); err != nil {
		return nil, errgrpc.ToNative(err)
	}
	return &shimv1.Empty{}, nil
}

// Tree lists every context of a sandbox: the snapshotter's tree (states,
// epochs, upper sizes, ended branches) with what this shim runs.
func (c *Service) Tree(ctx context.Context, req *shimv1.TreeRequest) (_ *shimv1.TreeResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	sb, err := c.Sandbox(req.Sandbox)
	if err != nil {
		return nil, err
	}
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := c.view(ctx, sb); err != nil {
		return nil, err
	}
	infos, err := sb.snapshot.Tree(ctx, sb.root())
	if err != nil {
		return nil, err
	}
	paused := c.Paused(sb)
	resp := &shimv1.TreeResponse{}
	for i := range infos {
		n := sb.nodes[infos[i].ID]
		if n == nil {
			n = &bctx{id: infos[i].ID, parent: infos[i].Parent}
		}
		resp.Nodes = append(resp.Nodes, c.describe(sb, n, &infos[i], true))
	}
	if root := sb.nodes[branch.RootID]; root != nil {
		if pid, err := c.initPid(ctx, sb, root); err == nil {
			for _, d := range resp.Nodes {
				if d.Id == branch.RootID {
					d.InitPid, d.Status = uint32(pid), "running"
				}
			}
		}
	}
	if paused {
		// Frozen with the sandbox: every context whose processes run.
		for _, d := range resp.Nodes {
			if d.Status != "" && d.Status != "exited" {
				d.Status = StatusPaused
			}
		}
	}
	return resp, nil
}

// describe is a context as the API reports it. Without readProcs, its
// processes are not read from its cgroup: a branch just started without a
// command has its init alone, and has had no OOM kill.
func (c *Service) describe(sb *sandbox, n *bctx, info *branch.Info, readProcs bool) *shimv1.Context {
	d := &shimv1.Context{Id: n.id, Parent: n.parent, Net: n.net, Seal: n.seal, Cgroup: n.cgroup, Memory: n.memory}
	if info != nil {
		d.Parent = info.Parent
		d.State = string(info.State)
		d.Epoch, d.ForkEpoch = info.Epoch, info.ForkEpoch
		d.Winner, d.WinnerEpoch = info.Winner, info.WinnerEpoch
		d.UpperSize, d.UpperInodes = info.UpperSize, info.UpperInodes
		d.Sealed, d.Children = info.Sealed, info.Children
		d.Quarantine = info.Quarantine
		if !info.Created.IsZero() {
			d.Created = timestamppb.New(info.Created)
		}
		if !info.Ended.IsZero() {
			d.Ended = timestamppb.New(info.Ended)
		}
	}
	if n.spec != nil {
		d.Limits = limitsOf(n.spec)
	}
	procs := n.procs()
	if !readProcs && procs != nil {
		d.Pids = []uint32{uint32(procs.Pid())}
	} else if n.cgroup != "" && (procs != nil || n.id == branch.RootID) {
		if ms, err := c.hier(); err == nil {
			dirs := cgroup.DirsIn(ms, n.cgroup)
			pids := cgroup.PidsIn(cgroup.OneHierarchy(dirs))
			sort.Ints(pids)
			for _, p := range pids {
				d.Pids = append(d.Pids, uint32(p))
			}
			d.OomKilled = cgroup.OOMKillsIn(dirs) > 0
		}
	}
	if procs != nil {
		d.InitPid = uint32(procs.Pid())
		switch {
		case n.exited:
			d.Status = "exited"
			if p, err := procs.Process(""); err == nil {
				d.ExitStatus = int32(p.ExitStatus())
			}
		case n.hasCommand || n.memory:
			d.Status = "running"
		default:
			d.Status = "waiting"
		}
	}
	if n.frozen || n.held {
		d.Status = "frozen"
	}
	return d
}
