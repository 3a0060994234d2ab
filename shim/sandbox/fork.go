//go:build linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/branchbox/branchbox/client/branchapi"
	"github.com/branchbox/branchbox/shim/brinit"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/initdriver"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

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
	made := make([]*Branch, len(infos))
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
	if parentID == branch.RootID && req.Net == NetShared && made[0].init != nil {
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
