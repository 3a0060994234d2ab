//go:build linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/branchbox/branchbox/client/branchapi"
	"github.com/branchbox/branchbox/shim/brinit"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/initdriver"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// A fork: the request checked, the parent sealed and its branches made by
// the snapshotter, each branch started (start.go), the whole undone if one
// fails.

// fork is one fork request under way, under the sandbox's lock.
type fork struct {
	sb          *Sandbox
	req         *shimv1.ForkRequest
	parentID    string
	parent      *Branch
	pid         int          // the parent's init, whose namespaces the branches join
	img         *memoryImage // the memory the branches are restored from, or nil
	ms          []cgroup.Dir // the host's cgroup hierarchies
	runtimePath bool         // the branches are started by the runtime, not the branch init
	join        joinNS       // the parent's namespaces the branches join
	aheads      []*initdriver.Ahead
	infos       []branch.Info // the branches the snapshotter made
	made        []*Branch     // the branches started, by the index of infos
	restoring   time.Time     // when the starts began
}

// Fork makes branches, each with its init running (waiting, or the given
// command), and seals the parent.
func (c *Service) Fork(ctx context.Context, req *shimv1.ForkRequest) (_ *shimv1.ForkResponse, retErr error) {
	ctx, stop := callerDeadline(ctx)
	defer stop()
	defer func() { retErr = toTTRPC(retErr) }()
	if err := checkFork(req); err != nil {
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
	defer sb.active()()
	f, err := c.planFork(ctx, sb, req)
	if err != nil {
		return nil, err
	}
	if f.img != nil { // a checkpoint's
		defer f.img.remove(context.WithoutCancel(ctx))
	}
	f.takeAhead(ctx)
	defer f.releaseAhead(ctx)
	if err := c.sealForFork(ctx, f); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			c.undoFork(ctx, f)
		}
	}()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: the caller gave up before it was done; undone: %w", forkOf(sb.id, f.parentID), err)
	}
	if req.Memory && f.img == nil {
		// Sealed first: the image and the branches' lower layer are
		// the same instant.
		if f.img, err = c.dumpMemory(ctx, sb, f.parent, fmt.Sprintf("memory fork of %s", sb.id)); err != nil {
			return nil, err
		}
		defer f.img.remove(context.WithoutCancel(ctx))
	}
	if err := c.startBranches(ctx, f); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		// Its caller is gone and would never learn of these branches:
		// they are undone rather than left to appear unasked.
		return nil, fmt.Errorf("%s: the caller gave up before it was done; undone: %w", forkOf(sb.id, f.parentID), err)
	}
	return c.forked(ctx, f), nil
}

// checkFork checks a fork request's numbers and words, and fills in the
// defaults.
func checkFork(req *shimv1.ForkRequest) error {
	if req.Count < 1 || req.Count > 1024 {
		return fmt.Errorf("fork: count must be 1 to 1024, got %d: %w", req.Count, errdefs.ErrInvalidArgument)
	}
	switch req.Seal {
	case "":
		req.Seal = SealReadOnly
	case SealReadOnly, SealFreeze:
	default:
		return fmt.Errorf("fork: seal %q: want %q or %q: %w", req.Seal, SealReadOnly, SealFreeze, errdefs.ErrInvalidArgument)
	}
	switch req.Net {
	case "":
		req.Net = NetShared
	case NetShared, NetIsolated:
	default:
		return fmt.Errorf("fork: net %q: want %q or %q: %w", req.Net, NetShared, NetIsolated, errdefs.ErrInvalidArgument)
	}
	return checkLimits(req.Limits)
}

// takeAhead takes inits started ahead, their cgroups renamed to the names
// the next branch ids give while the snapshotter makes the branches; each
// start claims its own (start).
func (f *fork) takeAhead(ctx context.Context) {
	sb := f.sb
	if f.runtimePath || f.parentID != branch.RootID || f.req.Net != NetShared || sb.pool == nil || sb.nextID == 0 {
		return
	}
	for i := range uint64(f.req.Count) {
		a := sb.pool.TakeAhead(ctx, branchCgroup(f.parent.cgroup, strconv.FormatUint(sb.nextID+i, 10)))
		if a == nil {
			break
		}
		f.aheads = append(f.aheads, a)
	}
}

// newPool is the pool of inits started ahead of forks of parent whose
// branches have spec, up to their cgroup's name.
func newPool(ctx context.Context, d *initdriver.Driver, parent *Branch, spec *specs.Spec) *initdriver.Pool {
	return initdriver.NewPool(d, parent.cgroup, brinit.CloneFlags(spec), initdriver.PrepOf(ctx, spec))
}

// active marks an operation of sb as running, for its pool's refill,
// which starts its inits once the sandbox is quiet
// (initdriver.Pool.Active); the caller holds sb.mu.
func (sb *Sandbox) active() (done func()) {
	if sb.pool == nil {
		return func() {}
	}
	return sb.pool.Active()
}

// nextNames names the cgroups of the root's next branches, the k-th from
// now that of id nextID+k, for the pool to start its inits in (nil: the
// next id is not known).
func (sb *Sandbox) nextNames(parent string) func(int) string {
	next := sb.nextID
	if next == 0 {
		return nil
	}
	return func(k int) string { return branchCgroup(parent, strconv.FormatUint(next+uint64(k), 10)) }
}

// releaseAhead discards the inits taken ahead that no start claimed.
func (f *fork) releaseAhead(ctx context.Context) {
	for _, a := range f.aheads {
		a.Release(ctx)
	}
}

// sealForFork seals the parent and has the snapshotter make the branches.
// The snapshotter's answer is waited for even if the caller gives up
// meanwhile: branches it made are then undone rather than left live
// there, sealing the parent, with no branch running them.
func (c *Service) sealForFork(ctx context.Context, f *fork) error {
	sb := f.sb
	sctx, answered := answerCtx(ctx, answerGrace)
	infos, err := c.sealFork(sctx, sb, f.parent, f.pid, f.req)
	if sb.releasing.retryForRoom(sctx, err) {
		infos, err = c.sealFork(sctx, sb, f.parent, f.pid, f.req)
	}
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
		return err
	}
	f.infos, f.made = infos, make([]*Branch, len(infos))
	return nil
}

// A caller of a branch operation may give up (its deadline passes, or it
// hangs up) at any point. What it left unfinished must not go on to
// happen later, unseen: an operation checks whether its caller is still
// there once it holds the sandbox (load), and a fork made after its caller
// left is undone (Fork). A call to the snapshotter that the caller gives
// up on midway may still be carried out there, so one whose result the
// shim needs in order to undo it is waited for regardless (answerCtx).

// answerGrace bounds how long a call to the snapshotter is still waited
// for once its caller gave up.
const answerGrace = time.Minute

// answerCtx is ctx for a call to the snapshotter whose answer is needed
// even if the caller gives up: it keeps ctx's values, is not cancelled
// with ctx, and ends grace after ctx does. Call the returned func when
// the call is done.
func answerCtx(ctx context.Context, grace time.Duration) (context.Context, func()) {
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var (
		mu    sync.Mutex
		timer *time.Timer
		done  bool
	)
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			timer = time.AfterFunc(grace, cancel)
		}
	})
	return actx, func() {
		stop()
		mu.Lock()
		done = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// undoFork ends the branches of a failed fork, in the shim and in the
// snapshotter, and unseals the parent if it has no other branch. It is
// done even if the fork failed because its caller gave up: a branch it
// leaves would appear later with nobody knowing it.
func (c *Service) undoFork(ctx context.Context, f *fork) {
	ctx = context.WithoutCancel(ctx)
	sb := f.sb
	for i, info := range f.infos {
		if f.made[i] != nil {
			c.destroy(ctx, sb, f.made[i])
		}
		if _, err := sb.snapshot.Abort(ctx, sb.ref(info.ID)); err != nil {
			log.G(ctx).WithError(err).WithField("branch", info.ID).Warn("abort branch of a failed fork")
		}
	}
	c.unsealIfIdle(ctx, sb, f.parent)
}

// startBranches starts the branches the snapshotter made, a few at a
// time; a start refused by a process limit fails the fork in one line.
func (c *Service) startBranches(ctx context.Context, f *fork) error {
	sb, parent := f.sb, f.parent
	f.checkAhead(ctx)
	if err := cgroup.PrepareBranchParent(ctx, parent.cgroup); err != nil {
		return fmt.Errorf("%s: make room for branch cgroups: %w", forkOf(sb.id, f.parentID), err)
	}
	errs := make([]error, len(f.infos))
	var wg sync.WaitGroup
	sem := make(chan struct{}, c.startsAtOnce(f))
	f.restoring = time.Now()
	for i, info := range f.infos {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var a *initdriver.Ahead
			if i < len(f.aheads) {
				a = f.aheads[i]
			}
			f.made[i], errs[i] = c.start(ctx, sb, parent, info, f.join, f.req, a, f.img)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		slack := int64(0)
		if f.runtimePath {
			slack = runtimeStartPids
		}
		if pl := cgroup.AsPidsLimit(errs, cgroup.PidsLimits(f.ms, parent.cgroup), slack); pl != nil {
			// One line, not the runtime's story of each failed start.
			return sb.pidsRefusal(parent, pl)
		}
		if !alive(f.pid) {
			return f.parentEnded()
		}
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			return f.noRoom()
		}
		return fmt.Errorf("%s: %w", forkOf(sb.id, f.parentID), err)
	}
	return nil
}

// parentEnded words a fork whose starts failed because the parent's init
// ended meanwhile (the sandbox stopped or was killed, the branch's command
// exited): the starts' own errors (a namespace of a process that is gone,
// a cgroup write for no process, with host paths) say nothing a user can
// act on. The fork is undone as any failed fork is.
func (f *fork) parentEnded() error {
	return fmt.Errorf("%s: %s's init exited during the fork; its branches were undone: %w", forkOf(f.sb.id, f.parentID), branchName(f.parentID), errdefs.ErrFailedPrecondition)
}

// noRoom words a fork whose starts failed for want of space where their
// bundles are written (the spec a branch started by the runtime needs):
// one line, where each start said "write spec: write <its bundle's
// path>/config.json: no space left on device", host paths a sandbox
// asking through its socket is not shown.
func (f *fork) noRoom() error {
	return fmt.Errorf("%s: no room for its branches' bundles in the sandbox's bundle, in containerd's state directory (a tmpfs sized by the node's memory on most nodes): make room there: %w", forkOf(f.sb.id, f.parentID), errdefs.ErrResourceExhausted)
}

// checkAhead drops every init taken ahead if a guess was wrong (ids used
// behind the shim's back): the guessed names may be other branches' of
// this fork, so every init taken ahead goes, cgroup and all, before any
// start makes one.
func (f *fork) checkAhead(ctx context.Context) {
	for i, a := range f.aheads {
		if i >= len(f.infos) || a.Guess != branchCgroup(f.parent.cgroup, f.infos[i].ID) {
			f.dropAhead(ctx)
			return
		}
	}
}

// dropAhead discards every init taken ahead, cgroup and all.
func (f *fork) dropAhead(ctx context.Context) {
	f.releaseAhead(ctx)
	f.aheads = nil
}

// startsAtOnce is how many branches of a fork start at once: two with the
// runtime (each start runs a Go binary twice, and more in parallel only
// queue on the CPUs); four with the branch init, whose starts mostly wait
// (cgroup moves, mounts).
func (c *Service) startsAtOnce(f *fork) int {
	par := 2
	if c.inits.Binary != "" {
		par = 4
	}
	if f.runtimePath && len(cgroup.PidsLimits(f.ms, f.parent.cgroup)) > 0 {
		// The runtime moves its init's first process into the cgroup
		// unchecked (a v1 move), then forks from it: one at a time, the
		// room counted up front (pidsRoom) holds for each.
		par = 1
	}
	return par
}

// forked records the started branches in the sandbox, marks the parent
// sealed, publishes the fork and fills the pool of inits started ahead.
func (c *Service) forked(ctx context.Context, f *fork) *shimv1.ForkResponse {
	sb, parent, req, made := f.sb, f.parent, f.req, f.made
	parent.seal = req.Seal
	if parent.state.has(sealFrozen) {
		parent.seal = SealFreeze // by request, or for files open for writing
	}
	resp := &shimv1.ForkResponse{}
	if img := f.img; img != nil {
		resp.Memory = &shimv1.MemoryFork{PauseNs: int64(img.pause), DumpNs: int64(img.dump), RestoreNs: int64(time.Since(f.restoring)), ImageBytes: img.size}
	}
	ids := make([]string, len(made))
	for i, n := range made {
		sb.nodes[n.id] = n
		ids[i] = n.id
		resp.Branches = append(resp.Branches, c.describe(sb, n, &f.infos[i], n.hasCommand || n.memory))
	}
	c.publish(ctx, TopicFork, &branchEvent{Sandbox: sb.id, Parent: f.parentID, Branches: ids})
	if f.parentID == branch.RootID && req.Net == NetShared && made[0].init != nil {
		if sb.pool == nil {
			sb.pool = newPool(ctx, c.inits, parent, made[0].spec)
		}
		sb.pool.Fill(ctx, int(req.Count), sb.nextNames(parent.cgroup))
	}
	return resp
}

// checkLimits refuses limits that are out of range; zero means "the
// parent's".
func checkLimits(l *shimv1.Limits) error {
	if l == nil {
		return nil
	}
	if l.Memory != 0 && l.Memory < MinBranchMemory {
		return fmt.Errorf("fork: memory limit %d bytes is below the minimum of %d (6 MiB): %w", l.Memory, MinBranchMemory, errdefs.ErrInvalidArgument)
	}
	if math.IsNaN(l.Cpus) || math.IsInf(l.Cpus, 0) {
		return fmt.Errorf("fork: CPU limit %v is not a number of CPUs: %w", l.Cpus, errdefs.ErrInvalidArgument)
	}
	if l.Cpus != 0 && (l.Cpus < MinBranchCPUs || l.Cpus > MaxBranchCPUs) {
		return fmt.Errorf("fork: CPU limit %v is out of range: give %v to %d CPUs (the kernel's smallest quota is 1 ms per 100 ms): %w", l.Cpus, MinBranchCPUs, MaxBranchCPUs, errdefs.ErrInvalidArgument)
	}
	if l.Pids < 0 || l.Pids > MaxBranchPids {
		return fmt.Errorf("fork: process limit %d is out of range: give 1 to %d: %w", l.Pids, MaxBranchPids, errdefs.ErrInvalidArgument)
	}
	return nil
}

// forkOf names a fork in errors, in the user's terms: "fork of sandbox SB"
// or "fork of branch N of sandbox SB".
func forkOf(sandbox, parentID string) string {
	if parentID == branch.RootID {
		return "fork of sandbox " + sandbox
	}
	return "fork of branch " + parentID + " of sandbox " + sandbox
}
