//go:build linux

package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/branchbox/branchbox/client/branchapi"

	"github.com/containerd/console"
	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/runc/options"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/runc"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	cshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/containerd/v2/pkg/sys/reaper"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	runcC "github.com/containerd/go-runc"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// Event topics published to containerd's event service.
const (
	TopicFork       = "/branch/fork"
	TopicCommit     = "/branch/commit"
	TopicAbort      = "/branch/abort"
	TopicInvalidate = "/branch/invalidate"
)

// branchesDir is where, inside the sandbox's bundle, each branch context
// has its own bundle (config.json, rootfs mount point, pid files).
const branchesDir = "branches"

// RuntimeBinary is the name of the runtime-only build of this binary
// (cmd/containerd-shim-branch-v1/runtime), looked for beside the shim.
const RuntimeBinary = "containerd-shim-branch-v1-runtime"

// branchRuntime is the binary that runs branch contexts: the runtime-only
// build beside the shim if there is one, for it starts in about half the
// time, and this binary (which is a runtime too) otherwise.
func branchRuntime(self string) string {
	p := filepath.Join(filepath.Dir(self), RuntimeBinary)
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return p
	}
	return self
}

// RuntimeID is the runtime container id of branch b of sandbox id.
func RuntimeID(sandbox, b string) string { return sandbox + ".b" + b }

// contexts serves the branch context API of every sandbox this shim runs.
type contexts struct {
	ctx       context.Context
	self      string
	runtime   string // the binary branch containers are run with
	init      string // the branch init, "" to run every branch with the runtime
	publisher cshim.Publisher
	task      taskAPI.TTRPCTaskService
	platform  stdio.Platform

	mu        sync.Mutex
	sandboxes map[string]*sandbox

	// events go to containerd in the order they happen, from one
	// goroutine, so that a reply does not wait for the event service.
	events chan queuedEvent

	// Exits of our processes come from the shim's one reaper: pid to
	// process, and exits no process claimed yet (a short process can exit
	// before its pid is registered).
	pidMu   sync.Mutex
	pids    map[int]process.Process
	pending map[int]pendingExit

	insock selfSocks // the branch sockets inside sandboxes (insock.go)

	// The node's bounds on sandboxes (bounds.go), from the environment; a
	// bad setting fails every sandbox's creation, naming it.
	nodeBounds    bounds
	nodeBoundsErr error

	// cloneMu makes the clones into cgroups under a process limit on a
	// v1 pids hierarchy one at a time: the thread that forks each is
	// moved in unchecked first (clonein.go).
	cloneMu sync.Mutex

	// The host's cgroup hierarchies, read once: they are mounted at boot,
	// and reading the mount table at every fork, commit and listing
	// costs more than the rest of a listing.
	hierOnce sync.Once
	hierList []cgroupMount
}

// hier is the host's cgroup hierarchies.
func (c *contexts) hier() ([]cgroupMount, error) {
	c.hierOnce.Do(func() {
		c.hierList, _ = cgroupMounts()
	})
	if len(c.hierList) == 0 {
		return cgroupMounts()
	}
	return c.hierList, nil
}

type queuedEvent struct {
	ctx   context.Context
	topic string
	ev    *eventstypes.ContainerUpdate
}

type pendingExit struct {
	e  runcC.Exit
	at time.Time
}

// sandbox is a container this shim created, and its branch contexts.
type sandbox struct {
	id, ns, bundle string
	upper          string
	opts           *options.Options
	bounds         bounds        // its live-branch, depth and fork-rate bounds (bounds.go)
	forks          *rate.Limiter // its in-sandbox forks, at its fork rate
	output         *outputBudget // the output kept for its socket's un-waited processes (insock.go)
	// cgroup is the sandbox's cgroup path, whose freezer says whether it
	// is paused (pause.go); "" if its spec did not say.
	cgroup string

	// mu serializes fork, commit and abort on one sandbox: a commit checks
	// and kills before the snapshotter decides, and must not interleave.
	mu       sync.Mutex
	nodes    map[string]*bctx // branch contexts by id, and "0"
	snapshot *branchapi.Client
	pool     *initPool // inits started ahead of forks of the root, or nil
	nextID   uint64    // the branch id the snapshotter likely gives next (0: not known)
	initPath initPath  // how its branches start (initpath.go)
	// releasing counts the removals of ended branches' cgroups and
	// runtime state still going on; teardown waits for them.
	releasing sync.WaitGroup
	// starting counts execs starting their process outside mu; a Pause
	// waits for them.
	starting starts

	// gen is the snapshotter client's generation when the contexts were
	// last reconciled with the snapshotter's tree (reconciled says they
	// ever were); a change means the snapshotter restarted since, and may
	// have finished decided commits. kick asks the settle loop to
	// reconcile as soon as the snapshotter answers; done ends it.
	gen        uint64
	reconciled bool
	kick       chan struct{}
	done       chan struct{}
	closed     bool

	// stopped: its init exited; its branches were ended and no branch
	// operation is taken any more. stoppedCh is closed once they are gone.
	stopped   bool
	stopOnce  sync.Once
	stoppedCh chan struct{}

	// Processes exec'd into branches that ended since (killed with them),
	// kept until waited for: a Wait that reaches the shim after the
	// commit that killed its branch still gets the exit status.
	endedMu sync.Mutex
	ended   map[string]process.Process // by branch/exec id
}

// maxEnded bounds the processes of ended branches kept for Wait.
const maxEnded = 1024

func (sb *sandbox) keepEnded(branchID string, ps []process.Process) {
	sb.endedMu.Lock()
	defer sb.endedMu.Unlock()
	if sb.ended == nil || len(sb.ended)+len(ps) > maxEnded {
		sb.ended = map[string]process.Process{}
	}
	for _, p := range ps {
		sb.ended[branchID+"/"+p.ID()] = p
	}
}

func (sb *sandbox) takeEnded(branchID, execID string) process.Process {
	sb.endedMu.Lock()
	defer sb.endedMu.Unlock()
	p := sb.ended[branchID+"/"+execID]
	delete(sb.ended, branchID+"/"+execID)
	return p
}

// bctx is one context: the sandbox itself ("0") or a branch.
type bctx struct {
	id, parent string
	runtimeID  string
	bundle     string
	cgroup     string
	spec       *specs.Spec
	net        string
	seal       string // how this context is sealed while it has children
	frozen     bool
	writers    bool            // its last fork found its processes writing (sealwriters.go)
	container  *runc.Container // run by the runtime; nil for the sandbox
	fast       *fastCtx        // run by the branch init; nil for the sandbox
	limits     *shimv1.Limits  // given at fork
	hasCommand bool
	exited     bool
	// held: frozen for a commit whose outcome is not known yet; killed
	// once the snapshotter decided it, thawed if it did not.
	held bool
}

// ctxProcs is what a running context's processes are kept by: the
// runtime's container or the branch init.
type ctxProcs interface {
	Pid() int
	Process(execID string) (process.Process, error)
}

// procs is the context's processes, nil for the sandbox or a context whose
// processes are gone.
func (n *bctx) procs() ctxProcs {
	switch {
	case n.fast != nil:
		return n.fast
	case n.container != nil:
		return n.container
	}
	return nil
}

func newContexts(ctx context.Context, self string, publisher cshim.Publisher, task taskAPI.TTRPCTaskService) (*contexts, error) {
	platform, err := runc.NewPlatform()
	if err != nil {
		return nil, fmt.Errorf("branch contexts: console platform: %w", err)
	}
	c := &contexts{
		ctx: ctx, self: self, runtime: branchRuntime(self), init: fastInit(self), publisher: publisher, task: task, platform: platform,
		sandboxes: map[string]*sandbox{},
		pids:      map[int]process.Process{},
		pending:   map[int]pendingExit{},
		events:    make(chan queuedEvent, 1024),
	}
	c.nodeBounds, c.nodeBoundsErr = readNodeBounds()
	ec := reaper.Default.Subscribe()
	go c.reap(ec)
	go c.forward()
	return c, nil
}

// forward publishes queued events in order until the shim's context ends.
func (c *contexts) forward() {
	for {
		select {
		case <-c.ctx.Done():
			return
		case q := <-c.events:
			if err := c.publisher.Publish(q.ctx, q.topic, q.ev); err != nil {
				log.G(q.ctx).WithError(err).WithField("topic", q.topic).Warn("publish branch event")
			}
		}
	}
}

func (c *contexts) reap(ec chan runcC.Exit) {
	for e := range ec {
		c.pidMu.Lock()
		p, ok := c.pids[e.Pid]
		if ok {
			delete(c.pids, e.Pid)
		} else {
			now := time.Now()
			c.pending[e.Pid] = pendingExit{e: e, at: now}
			if len(c.pending) > 512 {
				for pid, pe := range c.pending {
					if now.Sub(pe.at) > 30*time.Second {
						delete(c.pending, pid)
					}
				}
			}
		}
		c.pidMu.Unlock()
		if ok {
			p.SetExited(e.Status)
		}
	}
}

// watch routes p's exit to it; started is when p was started, so that an
// exit of an earlier process with the same pid is not taken for p's.
func (c *contexts) watch(p process.Process, started time.Time) {
	pid := p.Pid()
	if pid <= 0 {
		return
	}
	c.pidMu.Lock()
	if pe, ok := c.pending[pid]; ok && !pe.at.Before(started) {
		delete(c.pending, pid)
		c.pidMu.Unlock()
		p.SetExited(pe.e.Status)
		return
	}
	c.pids[pid] = p
	c.pidMu.Unlock()
}

// addSandbox records a container as it is created; its rootfs mounts name
// its snapshot.
func (c *contexts) addSandbox(ctx context.Context, r *taskAPI.CreateTaskRequest, opts *options.Options, b bounds) {
	ns, _ := namespaces.Namespace(ctx)
	upper := ""
	for _, m := range r.Rootfs {
		for _, o := range m.Options {
			if u, ok := strings.CutPrefix(o, "upperdir="); ok {
				upper = u
			}
		}
	}
	cgroup := ""
	if spec, err := readSpec(r.Bundle); err == nil && spec.Linux != nil {
		// Not resolvable: no cgroup of its own to look at (prepare
		// refuses its branches and says why).
		cgroup, _ = sandboxCgroup(spec.Linux.CgroupsPath)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.sandboxes[r.ID]; ok {
		return // added before its creation, to settle it (Create)
	}
	c.sandboxes[r.ID] = &sandbox{
		id: r.ID, ns: ns, bundle: r.Bundle, upper: upper, opts: opts, cgroup: cgroup, stoppedCh: make(chan struct{}),
		bounds: b, forks: newForkLimiter(b), output: newOutputBudget(),
	}
}

func (c *contexts) sandbox(id string) (*sandbox, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sb, ok := c.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %s is not a container of this shim: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// load prepares a sandbox for an operation on its branches (under sb.mu):
// the snapshotter connection and the root context, reconciled with the
// snapshotter's tree on first use and after every reconnection. A paused
// sandbox is refused (pause.go), and so is a caller that gave up while
// the operation waited for the sandbox.
func (c *contexts) load(ctx context.Context, sb *sandbox) error {
	if err := c.view(ctx, sb); err != nil {
		return err
	}
	if c.paused(sb) {
		return pausedError(sb)
	}
	return nil
}

// view is load for an operation that only reads, or that needs no
// process of a branch (the tree, waits, checkpoints): a paused sandbox is
// answered, but not reconciled until it is resumed.
func (c *contexts) view(ctx context.Context, sb *sandbox) error {
	if sb.stopped {
		return fmt.Errorf("sandbox %s is stopped: its branches were ended with it; start a new task of it first: %w", sb.id, errdefs.ErrFailedPrecondition)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox %s: the caller gave up before the operation could start: %w", sb.id, err)
	}
	if err := c.prepare(ctx, sb); err != nil {
		return err
	}
	c.sync(ctx, sb)
	return nil
}

// prepare dials the snapshotter and makes the root context, once.
func (c *contexts) prepare(ctx context.Context, sb *sandbox) error {
	if sb.nodes != nil {
		return nil
	}
	if sb.upper == "" {
		return fmt.Errorf("sandbox %s: its rootfs is not an overlay with an upper directory; run it with --snapshotter branch: %w", sb.id, errdefs.ErrFailedPrecondition)
	}
	root, err := branch.RootOfUpper(sb.upper)
	if err != nil {
		return fmt.Errorf("sandbox %s: rootfs not from the branch snapshotter (run it with --snapshotter branch): %w", sb.id, err)
	}
	addr, err := os.ReadFile(filepath.Join(root, "address"))
	if err != nil {
		return fmt.Errorf("sandbox %s: find the branch snapshotter's socket in %s/address: %v: %w", sb.id, root, err, errdefs.ErrUnavailable)
	}
	kick := make(chan struct{}, 1)
	client, err := branchapi.DialNotify(strings.TrimSpace(string(addr)), func() { wake(kick) })
	if err != nil {
		return err
	}
	spec, err := readSpec(sb.bundle)
	if err != nil {
		client.Close()
		return err
	}
	cg, err := sandboxCgroup(spec.Linux.CgroupsPath)
	if err != nil {
		client.Close()
		return fmt.Errorf("sandbox %s: %w", sb.id, err)
	}
	sb.snapshot = client
	sb.nodes = map[string]*bctx{branch.RootID: {
		id: branch.RootID, bundle: sb.bundle, cgroup: cg, spec: spec, net: NetShared,
	}}
	sb.kick, sb.done = kick, make(chan struct{})
	go c.settle(context.WithoutCancel(ctx), sb)
	if ms, err := c.hier(); err == nil {
		holdFreezerKey(ms, cg)
	}
	return nil
}

func (sb *sandbox) root() branch.Root { return branch.Root{Upperdir: sb.upper} }

func (sb *sandbox) ref(id string) branch.Ref {
	if id == branch.RootID {
		id = ""
	}
	return branch.Ref{Root: sb.root(), Branch: id}
}

// initPid is the pid of a context's init on the host.
func (c *contexts) initPid(ctx context.Context, sb *sandbox, n *bctx) (int, error) {
	procs := n.procs()
	if procs == nil {
		st, err := c.task.State(ctx, &taskAPI.StateRequest{ID: sb.id})
		if err != nil {
			return 0, errgrpc.ToNative(err)
		}
		if st.Status != tasktypes.Status_RUNNING && st.Status != tasktypes.Status_PAUSED {
			return 0, fmt.Errorf("sandbox %s is %s, not running: start its task first: %w", sb.id, strings.ToLower(st.Status.String()), errdefs.ErrFailedPrecondition)
		}
		return int(st.Pid), nil
	}
	pid := procs.Pid()
	if n.exited || pid <= 0 {
		return 0, fmt.Errorf("branch %s has no running init (its command exited): %w", n.id, errdefs.ErrFailedPrecondition)
	}
	return pid, nil
}

func withNS(ctx context.Context, sb *sandbox) context.Context {
	return namespaces.WithNamespace(ctx, sb.ns)
}

// Fork makes branch contexts, each with its init running (waiting, or the
// given command), and seals the parent.
func (c *contexts) Fork(ctx context.Context, req *shimv1.ForkRequest) (_ *shimv1.ForkResponse, retErr error) {
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
	sb, err := c.sandbox(req.Sandbox)
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
	ms, _ := c.hier()
	runtimePath := c.init == "" || fastUnsupported(parent.spec) != ""
	if err := c.pidsRoom(sb, parent, ms, runtimePath, req); err != nil {
		return nil, err
	}
	netns := ""
	if req.Net == NetShared {
		netns = fmt.Sprintf("/proc/%d/ns/net", pid)
	}
	// Inits started ahead are taken now, their cgroups renamed to the
	// names the next branch ids give while the snapshotter makes the
	// branches; each start claims its own (start).
	var aheads []*ahead
	if !runtimePath && parentID == branch.RootID && req.Net == NetShared && sb.pool != nil && sb.nextID > 0 {
		for i := range uint64(req.Count) {
			a := sb.pool.takeAhead(ctx, branchCgroup(parent.cgroup, strconv.FormatUint(sb.nextID+i, 10)))
			if a == nil {
				break
			}
			aheads = append(aheads, a)
		}
	}
	defer func() {
		for _, a := range aheads {
			a.release(ctx)
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
	for i, a := range aheads {
		if i >= len(infos) || a.guess != branchCgroup(parent.cgroup, infos[i].ID) {
			// A wrong guess (ids used behind the shim's back): the
			// guessed names may be other branches' of this fork, so
			// every init taken ahead goes, cgroup and all, before any
			// start makes one.
			for _, a := range aheads {
				a.release(ctx)
			}
			aheads = nil
			break
		}
	}
	if err := prepareBranchParent(ctx, parent.cgroup); err != nil {
		return nil, fmt.Errorf("fork %s of %s: make room for branch cgroups: %w", parentID, sb.id, err)
	}
	errs := make([]error, len(infos))
	var wg sync.WaitGroup
	// Two at a time with the runtime (each start runs a Go binary twice,
	// and more in parallel only queue on the CPUs); four with the branch
	// init, whose starts mostly wait (cgroup moves, mounts).
	par := 2
	if c.init != "" {
		par = 4
	}
	if runtimePath && len(pidsLimits(ms, parent.cgroup)) > 0 {
		// The runtime moves its init's first process into the cgroup
		// unchecked (a v1 move), then forks from it: one at a time, the
		// room counted up front (pidsRoom) holds for each.
		par = 1
	}
	sem := make(chan struct{}, par)
	for i, info := range infos {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var a *ahead
			if i < len(aheads) {
				a = aheads[i]
			}
			made[i], errs[i] = c.start(ctx, sb, parent, info, netns, req, a)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		slack := int64(0)
		if runtimePath {
			slack = runtimeStartPids
		}
		if pl := asPidsLimit(errs, pidsLimits(ms, parent.cgroup), slack); pl != nil {
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
			sb.pool = newInitPool(c, parent.cgroup, cloneFlags(made[0].spec), prepOf(ctx, made[0].spec))
		}
		sb.pool.fill(ctx, int(req.Count))
	}
	parent.seal = req.Seal
	if parent.frozen {
		parent.seal = SealFreeze // by request, or for files open for writing
	}
	resp := &shimv1.ForkResponse{}
	ids := make([]string, len(made))
	for i, n := range made {
		sb.nodes[n.id] = n
		ids[i] = n.id
		resp.Branches = append(resp.Branches, c.describe(sb, n, &infos[i], n.hasCommand))
	}
	c.publish(ctx, TopicFork, &branchEvent{Sandbox: sb.id, Parent: parentID, Branches: ids})
	return resp, nil
}

// branchCgroup is the cgroup of branch id whose parent context's cgroup
// is parent (abortLost finds a lost branch's by the same rule).
func branchCgroup(parent, id string) string { return parent + "/b" + id }

// start creates one branch context: its bundle, its rootfs mount and its
// init, through the same runtime path as any container of this shim.
// An init taken ahead for it (nil: none) is claimed or released.
func (c *contexts) start(ctx context.Context, sb *sandbox, parent *bctx, info branch.Info, netns string, req *shimv1.ForkRequest, warm *ahead) (_ *bctx, retErr error) {
	n := &bctx{
		id: info.ID, parent: parent.id, runtimeID: RuntimeID(sb.id, info.ID),
		bundle: filepath.Join(sb.bundle, branchesDir, info.ID),
		cgroup: branchCgroup(parent.cgroup, info.ID),
		net:    req.Net, seal: SealReadOnly, hasCommand: len(req.Args) > 0, limits: req.Limits,
	}
	spec, err := branchSpec(parent.spec, n.cgroup, netns, req)
	if err != nil {
		return nil, err
	}
	n.spec = spec
	if err := os.MkdirAll(n.bundle, 0o700); err != nil {
		return nil, fmt.Errorf("branch %s: make bundle: %w", info.ID, err)
	}
	defer func() {
		if retErr != nil {
			c.closeSelf(sb.id, n.id)
			_ = os.RemoveAll(n.bundle)
		}
	}()
	if err := c.listenSelfBranch(ctx, sb, n); err != nil {
		return nil, err
	}
	if c.useInit(ctx, sb, spec) {
		var pool *initPool
		if parent.id == branch.RootID {
			pool = sb.pool
		}
		if err := c.startWithInit(ctx, sb, n, info, pool, warm); err != nil {
			return nil, err
		}
		return n, nil
	}
	if err := writeSpec(n.bundle, spec); err != nil {
		return nil, fmt.Errorf("branch %s: write spec: %w", info.ID, err)
	}
	opts := &options.Options{BinaryName: c.runtime, Root: DefaultRoot}
	if sb.opts != nil {
		if sb.opts.Root != "" {
			opts.Root = sb.opts.Root
		}
		// A branch is run as its sandbox is (runcopts.go).
		opts.NoPivotRoot, opts.NoNewKeyring = sb.opts.NoPivotRoot, sb.opts.NoNewKeyring
	}
	anyOpts, err := typeurl.MarshalAnyToProto(opts)
	if err != nil {
		return nil, err
	}
	var rootfs []*types.Mount
	for _, m := range info.Mounts {
		rootfs = append(rootfs, &types.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	cr := &taskAPI.CreateTaskRequest{ID: n.runtimeID, Bundle: n.bundle, Rootfs: rootfs, Options: anyOpts}
	if n.hasCommand {
		// The command's output is kept with the branch (init.log).
		cr.Stdout = "file://" + filepath.Join(n.bundle, "init.log")
		cr.Stderr = cr.Stdout
	}
	started := time.Now()
	container, err := runc.NewContainer(ctx, c.platform, cr)
	if err != nil {
		return nil, fmt.Errorf("branch %s: create its init: %w", info.ID, errgrpc.ToNative(err))
	}
	n.container = container
	init, _ := container.Process("")
	c.watch(init, started)
	if n.hasCommand {
		if _, err := container.Start(ctx, &taskAPI.StartRequest{ID: n.runtimeID}); err != nil {
			c.destroy(ctx, sb, n)
			return nil, fmt.Errorf("branch %s: start %v: %w", info.ID, req.Args, errgrpc.ToNative(err))
		}
		go func() {
			_ = init.Wait(context.WithoutCancel(ctx))
			sb.mu.Lock()
			n.exited = true
			sb.mu.Unlock()
		}()
	}
	return n, nil
}

// startWithInit starts a branch context with the branch init: its rootfs
// is mounted at <bundle>/rootfs as the runtime would, then the init builds
// the rest. The init is warm's if given, else taken from pool if it has
// one (nil: none), else started.
func (c *contexts) startWithInit(ctx context.Context, sb *sandbox, n *bctx, info branch.Info, pool *initPool, warm *ahead) (retErr error) {
	// The init is taken from the pool (its cgroup renamed to the
	// branch's), or started, while the rootfs is mounted.
	type spawnResult struct {
		s   *spawned
		err error
	}
	spawnDone := make(chan spawnResult, 1)
	go func() {
		flags := cloneFlags(n.spec)
		if warm != nil {
			if s := warm.claim(ctx, n.cgroup); s != nil {
				if s.flags == flags {
					spawnDone <- spawnResult{s: s}
					return
				}
				s.discard(ctx)
			}
		} else if pool != nil {
			if s := pool.take(ctx, flags, n.cgroup); s != nil {
				spawnDone <- spawnResult{s: s}
				return
			}
		}
		s, err := c.spawn(ctx, n.cgroup, flags)
		spawnDone <- spawnResult{s, err}
	}()
	rootfs := filepath.Join(n.bundle, "rootfs")
	var ms []mount.Mount
	for _, m := range info.Mounts {
		ms = append(ms, mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	err := os.Mkdir(rootfs, 0o711)
	if err != nil && !os.IsExist(err) {
		err = fmt.Errorf("branch %s: make rootfs mount point: %w", n.id, err)
	} else if err = mount.All(ms, rootfs); err != nil {
		err = fmt.Errorf("branch %s: mount rootfs: %w", n.id, err)
	}
	sr := <-spawnDone
	if err != nil || sr.err != nil {
		if sr.s != nil {
			sr.s.discard(ctx)
		}
		if err == nil {
			_ = unix.Unmount(rootfs, unix.MNT_DETACH)
			err = fmt.Errorf("branch %s: %w", n.id, sr.err)
		}
		return err
	}
	fc, err := c.configure(ctx, sb, n, sr.s, rootfs, filepath.Join(n.bundle, "init.log"))
	if err != nil {
		if uerr := mount.UnmountRecursive(rootfs, unix.MNT_DETACH); uerr != nil {
			log.G(ctx).WithError(uerr).WithField("branch", n.id).Warn("unmount rootfs of a failed branch")
		}
		return err
	}
	n.fast = fc
	if n.hasCommand {
		go func() {
			_ = fc.init.Wait(context.WithoutCancel(ctx))
			sb.mu.Lock()
			n.exited = true
			sb.mu.Unlock()
		}()
	}
	return nil
}

// destroy kills every process of a context (and of any context nested in
// it), then removes its init, its rootfs mount, cgroup and bundle.
func (c *contexts) destroy(ctx context.Context, sb *sandbox, n *bctx) {
	c.destroyAll(ctx, sb, []*bctx{n})()
}

// destroyAll destroys contexts together: their processes are all killed
// first, so that none of them runs on while another is taken down, then
// their rootfs mounts are detached. It returns once that is done, which is
// all the snapshotter needs before it commits or discards their layers,
// and all a caller needs before it replies: nothing of the branches runs
// any more. The rest (runtime state, cgroups, bundles) goes on in the
// background, counted in sb.releasing; the returned wait blocks until it
// is done.
func (c *contexts) destroyAll(ctx context.Context, sb *sandbox, ns []*bctx) (wait func()) {
	ms, err := c.hier()
	if err != nil {
		log.G(ctx).WithError(err).Error("list cgroup hierarchies")
	}
	var live []*bctx
	for _, n := range ns {
		if n.procs() != nil {
			live = append(live, n)
		}
	}
	dirs := make([][]cgroupMount, len(live))
	// A branch frozen for its children may have frozen descendants among
	// ns, whose processes the kill of any of them reaches.
	frozen := false
	for _, n := range live {
		frozen = frozen || n.frozen || n.held
	}
	var wg sync.WaitGroup
	for i, n := range live {
		dirs[i] = dirsIn(ms, n.cgroup)
		if n.fast != nil {
			// The branch runs on its own clone of the rootfs mount, so the
			// host's can go at once: its RCU grace period then overlaps
			// the one of the branch's mount namespace as it dies.
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := unix.Unmount(filepath.Join(n.bundle, "rootfs"), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
					log.G(ctx).WithError(err).WithField("branch", n.id).Warn("unmount branch rootfs")
				}
			}()
		}
		if n.held && len(dirs[i]) > 0 {
			// Signalled while still frozen, it dies as it thaws, without
			// running another instruction.
			err := signalAll(ctx, dirs[i])
			if err != nil {
				log.G(ctx).WithError(err).WithField("branch", n.id).Warn("kill held branch processes at once")
			}
			if err == nil && n.fast != nil && heldFrozen(dirs[i]) {
				// Frozen whole (a frozen cgroup's list of processes is
				// complete, and none can fork), so nothing of it runs
				// again: their exits are waited for by release, in the
				// background, rather than before the reply.
				thaw(dirs[i])
				continue
			}
		}
		pidfd := -1
		if n.fast != nil {
			pidfd = n.fast.init.dupPidfd()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			kill := func() error { return killDirs(ctx, n.cgroup, dirs[i]) }
			if pidfd >= 0 {
				defer unix.Close(pidfd)
				kill = func() error { return killBranch(ctx, n.cgroup, dirs[i], pidfd, frozen) }
			}
			if err := kill(); err != nil {
				log.G(ctx).WithError(err).WithField("branch", n.id).Error("kill branch processes")
			}
		}()
	}
	wg.Wait()
	containers := make([]ctxProcs, len(live))
	for i, n := range live {
		switch {
		case n.fast != nil:
			sb.keepEnded(n.id, n.fast.execd())
		case n.container != nil:
			sb.keepEnded(n.id, n.container.ExecdProcesses())
		}
		containers[i] = c.detach(ctx, n)
	}
	done := make(chan struct{})
	sb.releasing.Add(1)
	ctx = context.WithoutCancel(ctx)
	go func() {
		defer sb.releasing.Done()
		defer close(done)
		for i, n := range live {
			c.release(ctx, sb, n, containers[i], dirs[i])
		}
	}()
	return func() { <-done }
}

// detach takes a context whose processes are dead off its init and rootfs:
// it waits for the init's exit (from the shim's reaper) and unmounts the
// rootfs, after which the branch's layers are the snapshotter's alone.
func (c *contexts) detach(ctx context.Context, n *bctx) ctxProcs {
	container := n.procs()
	n.container, n.fast = nil, nil
	if _, ok := container.(*fastCtx); ok {
		// Its processes are gone from its cgroup, so they are dead: the
		// init's exit status (from the reaper) is not needed to go on.
		// Its host mount, which has nothing below it (the init mounted
		// the rest in the branch's own namespace, gone with it), was
		// detached with the kill.
		return container
	}
	if init, err := container.Process(""); err == nil {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := init.Wait(wctx); err != nil {
			log.G(ctx).WithError(err).WithField("branch", n.id).Warn("wait for branch init")
		}
		cancel()
	}
	if err := mount.UnmountRecursive(filepath.Join(n.bundle, "rootfs"), unix.MNT_DETACH); err != nil {
		log.G(ctx).WithError(err).WithField("branch", n.id).Warn("unmount branch rootfs")
	}
	return container
}

// release removes a detached context's runtime state and cgroups. The
// runtime state is destroyed in process (libcontainer needs no child
// process for a stopped container), which spares a run of the runtime
// binary per branch.
func (c *contexts) release(ctx context.Context, sb *sandbox, n *bctx, procs ctxProcs, cgroupDirs []cgroupMount) {
	c.closeSelf(sb.id, n.id)
	if fc, ok := procs.(*fastCtx); ok {
		fc.close()
		// killBranch looked at one hierarchy; a process put into the
		// cgroup from outside the branch may be in the others.
		if err := killLoop(ctx, n.cgroup, cgroupDirs, cgroupDirs); err != nil {
			log.G(ctx).WithError(err).WithField("branch", n.id).Error("kill what is left in a branch cgroup")
		}
		if err := removeDirs(cgroupDirs); err != nil {
			log.G(ctx).WithError(err).WithField("branch", n.id).Warn("remove branch cgroup")
		}
		go func() {
			ctx := context.WithoutCancel(ctx)
			for _, p := range fc.execd() {
				_ = p.Delete(ctx) // its exit came with the init's
			}
			if err := os.RemoveAll(n.bundle); err != nil {
				log.G(ctx).WithError(err).WithField("branch", n.id).Warn("remove branch bundle")
			}
		}()
		return
	}
	container := procs.(*runc.Container)
	root := DefaultRoot
	if sb.opts != nil && sb.opts.Root != "" {
		root = sb.opts.Root
	}
	if lc, err := libcontainer.Load(filepath.Join(root, sb.ns), n.runtimeID); err == nil {
		if err := lc.Destroy(); err != nil {
			log.G(ctx).WithError(err).WithField("branch", n.id).Warn("destroy branch runtime state")
		}
	} else if !errors.Is(err, libcontainer.ErrNotExist) {
		log.G(ctx).WithError(err).WithField("branch", n.id).Warn("load branch runtime state")
	}
	if err := removeDirs(cgroupDirs); err != nil {
		log.G(ctx).WithError(err).WithField("branch", n.id).Warn("remove branch cgroup")
	}
	// What is left (stdio copiers, exec'd process records, the bundle)
	// holds nothing of the branch's and goes in the background.
	go func() {
		ctx := context.WithoutCancel(ctx)
		for _, p := range container.ExecdProcesses() {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := p.Wait(wctx); err == nil {
				_ = p.Delete(ctx)
			}
			cancel()
		}
		if init, err := container.Process(""); err == nil {
			_ = init.Delete(ctx) // the runtime says "does not exist"; this closes its stdio
		}
		if err := os.RemoveAll(n.bundle); err != nil {
			log.G(ctx).WithError(err).WithField("branch", n.id).Warn("remove branch bundle")
		}
	}()
}

// unsealIfIdle thaws a context frozen for its children when it has none.
func (c *contexts) unsealIfIdle(ctx context.Context, sb *sandbox, n *bctx) {
	for _, o := range sb.nodes {
		if o.parent == n.id && o.id != branch.RootID {
			return
		}
	}
	if n.frozen {
		if err := thawOwn(ctx, n.cgroup); err != nil {
			log.G(ctx).WithError(err).WithField("context", n.id).Error("thaw sealed context")
		}
		n.frozen = false
	}
	n.seal = SealReadOnly
}

// descendants lists id's descendants among the running contexts, deepest
// first.
func (sb *sandbox) descendants(id string) []*bctx {
	var out []*bctx
	for _, n := range sb.nodes {
		if n.parent == id && n.id != branch.RootID {
			out = append(out, sb.descendants(n.id)...)
			out = append(out, n)
		}
	}
	return out
}

// Commit freezes the winner, lets the snapshotter apply its changes through
// the parent's live mount (first commit wins), then kills the winner and
// every invalidated branch. The winner is frozen rather than killed before
// the snapshotter decides, so that a commit the snapshotter refuses, or
// never got, leaves it running as it was; one whose outcome is unknown
// (the connection was lost mid-call) stays frozen until the snapshotter
// answers again, and is then killed or thawed as its tree says.
func (c *contexts) Commit(ctx context.Context, req *shimv1.CommitRequest) (_ *shimv1.CommitResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	if req.Branch == "" || req.Branch == branch.RootID {
		return nil, fmt.Errorf("name a branch of sandbox %s (SANDBOX/BRANCH), not the sandbox itself: %w", req.Sandbox, errdefs.ErrInvalidArgument)
	}
	sb, err := c.sandbox(req.Sandbox)
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
func (c *contexts) committed(ctx context.Context, sb *sandbox, winner, parentID string, invalidated []string, parent branch.Info) *shimv1.CommitResponse {
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
func (c *contexts) commitOutcome(ctx context.Context, sb *sandbox, id string, callErr error) (*shimv1.CommitResponse, error) {
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
func (c *contexts) Abort(ctx context.Context, req *shimv1.AbortRequest) (_ *shimv1.AbortResponse, retErr error) {
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
func (c *contexts) branchFor(ctx context.Context, sandboxID, id string, lock, write bool) (*sandbox, *bctx, error) {
	if id == "" || id == branch.RootID {
		return nil, nil, fmt.Errorf("name a branch of sandbox %s (SANDBOX/BRANCH), not the sandbox itself: %w", sandboxID, errdefs.ErrInvalidArgument)
	}
	sb, err := c.sandbox(sandboxID)
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
func (c *contexts) Exec(ctx context.Context, req *shimv1.ExecRequest) (_ *shimv1.ExecResponse, retErr error) {
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
		p, err := fc.exec(ctx, req.ExecId, &ps, req.Stdin, req.Stdout, req.Stderr)
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
func (c *contexts) proc(ctx context.Context, sandboxID, id, execID string, write bool) (*bctx, func(string), process.Process, error) {
	sb, n, err := c.branchFor(ctx, sandboxID, id, true, write)
	if err != nil {
		return nil, nil, nil, err
	}
	procs := n.procs()
	var remove func(string)
	switch {
	case n.fast != nil:
		remove = n.fast.remove
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
func (c *contexts) Wait(ctx context.Context, req *shimv1.WaitRequest) (_ *shimv1.WaitResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	n, remove, p, err := c.proc(ctx, req.Sandbox, req.Branch, req.ExecId, false)
	if err != nil {
		if sb, serr := c.sandbox(req.Sandbox); serr == nil && req.ExecId != "" {
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
			resp.OomKilled = oomKillsIn(dirsIn(ms, n.cgroup)) > 0
		}
	}
	if req.ExecId != "" {
		_ = p.Delete(ctx)
		remove(req.ExecId)
	}
	return resp, nil
}

func (c *contexts) ResizePty(ctx context.Context, req *shimv1.ResizePtyRequest) (_ *shimv1.Empty, retErr error) {
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

func (c *contexts) CloseIO(ctx context.Context, req *shimv1.CloseIORequest) (_ *shimv1.Empty, retErr error) {
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

func (c *contexts) Kill(ctx context.Context, req *shimv1.KillRequest) (_ *shimv1.Empty, retErr error) {
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
func (c *contexts) Tree(ctx context.Context, req *shimv1.TreeRequest) (_ *shimv1.TreeResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	sb, err := c.sandbox(req.Sandbox)
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
	paused := c.paused(sb)
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
func (c *contexts) describe(sb *sandbox, n *bctx, info *branch.Info, readProcs bool) *shimv1.Context {
	d := &shimv1.Context{Id: n.id, Parent: n.parent, Net: n.net, Seal: n.seal, Cgroup: n.cgroup}
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
			dirs := dirsIn(ms, n.cgroup)
			pids := pidsIn(oneHierarchy(dirs), false)
			sort.Ints(pids)
			for _, p := range pids {
				d.Pids = append(d.Pids, uint32(p))
			}
			d.OomKilled = oomKillsIn(dirs) > 0
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
		case n.hasCommand:
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

// teardown removes every branch context of a sandbox whose task is being
// deleted, and unseals its rootfs, so that nothing outlives it.
func (c *contexts) teardown(ctx context.Context, id string) {
	defer c.closeSelfAll(id)
	c.mu.Lock()
	sb, ok := c.sandboxes[id]
	delete(c.sandboxes, id)
	c.mu.Unlock()
	if !ok {
		return
	}
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	c.endAll(ctx, sb)
	if sb.snapshot != nil {
		sb.snapshot.Close()
	}
}

// sandboxExited kills and discards every branch of a sandbox whose init
// exited, as runc-v2 kills every process of a container whose init
// exited: the branches live in their own PID namespaces, which the init's
// end does not reach. Branch operations on it fail from then on, until
// its task is deleted and a new one created.
func (c *contexts) sandboxExited(ctx context.Context, id string) {
	sb, err := c.sandbox(id)
	if err != nil {
		return
	}
	defer sb.markStopped()
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.stopped = true
	c.endAll(ctx, sb)
}

// markStopped says that nothing of the sandbox's branches runs any more.
func (sb *sandbox) markStopped() {
	sb.stopOnce.Do(func() { close(sb.stoppedCh) })
}

// waitStopped waits until the branches of a sandbox whose init exited are
// gone, so that a Wait for its init returns only once nothing of it runs.
func (c *contexts) waitStopped(ctx context.Context, id string) error {
	sb, err := c.sandbox(id)
	if err != nil {
		return nil // deleted: teardown took its branches
	}
	select {
	case <-sb.stoppedCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// endAll kills and discards every branch of a sandbox, with the guarantees
// of an abort, and unseals its rootfs; sb.mu is held. It runs once.
func (c *contexts) endAll(ctx context.Context, sb *sandbox) {
	if sb.nodes == nil || sb.closed {
		return
	}
	sb.closed = true
	close(sb.done)
	if sb.pool != nil {
		sb.pool.close(ctx)
		sb.pool = nil
	}
	defer sb.initPath.close()
	for _, d := range sb.descendants(branch.RootID) {
		c.destroy(ctx, sb, d)
		delete(sb.nodes, d.id)
		if d.parent == branch.RootID {
			if _, err := sb.snapshot.Abort(ctx, sb.ref(d.id)); err != nil {
				log.G(ctx).WithError(err).WithField("branch", d.id).Warn("abort branch of ended sandbox")
			}
		}
	}
	if root := sb.nodes[branch.RootID]; root != nil && root.frozen {
		_ = thawOwn(ctx, root.cgroup)
		root.frozen = false
	}
	// The sandbox's cgroup goes after this: its branches' must be gone.
	sb.releasing.Wait()
	if ms, err := c.hier(); err == nil && sb.nodes[branch.RootID] != nil {
		releaseFreezerKey(ms, sb.nodes[branch.RootID].cgroup)
	}
}

// branchEvent is what a fork, commit, abort or invalidation publishes.
type branchEvent struct {
	Sandbox, Parent string
	Branches        []string
	Winner          string
	Epoch           uint64
}

// publish queues a branch event for containerd's event service. It travels
// as containerd's own ContainerUpdate type (the sandbox's id, and labels
// branchbox.parent, .branches, .winner, .epoch) on a /branch/ topic, so
// that `ctr events` and every containerd client can decode it; a type of
// our own would be skipped by clients that do not link it.
func (c *contexts) publish(ctx context.Context, topic string, ev *branchEvent) {
	if c.publisher == nil {
		return
	}
	labels := map[string]string{
		"branchbox.parent":   ev.Parent,
		"branchbox.branches": strings.Join(ev.Branches, ","),
	}
	if ev.Winner != "" {
		labels["branchbox.winner"] = ev.Winner
		labels["branchbox.epoch"] = strconv.FormatUint(ev.Epoch, 10)
	}
	// The request's context ends with the reply; the event goes after it.
	c.events <- queuedEvent{ctx: context.WithoutCancel(ctx), topic: topic, ev: &eventstypes.ContainerUpdate{ID: ev.Sandbox, Labels: labels}}
}

func ids(ns []*bctx) string {
	var s []string
	for _, n := range ns {
		s = append(s, n.id)
	}
	sort.Slice(s, func(i, j int) bool { a, _ := strconv.Atoi(s[i]); b, _ := strconv.Atoi(s[j]); return a < b })
	return strings.Join(s, ", ")
}

// toTTRPC carries errdefs kinds, and a stale branch's winner, over ttrpc.
func toTTRPC(err error) error { return branch.ToGRPC(err) }

// stopBranches is the cleanup of a sandbox whose shim died: it force
// deletes every branch context's runtime container (killing its processes
// through its cgroup) and detaches its rootfs mount. It needs nothing from
// the dead shim: the branches are found in the bundle.
func stopBranches(ctx context.Context, r *runcC.Runc, bundle, id string) {
	killBranchCgroups(ctx, bundle)
	entries, _ := os.ReadDir(filepath.Join(bundle, branchesDir))
	for _, e := range entries {
		// Only a branch run by the runtime has its spec in its bundle;
		// one run by the branch init ends with the shim's control socket.
		if _, err := os.Stat(filepath.Join(bundle, branchesDir, e.Name(), "config.json")); err != nil {
			// fall through to the unmount
		} else if err := r.Delete(ctx, RuntimeID(id, e.Name()), &runcC.DeleteOpts{Force: true}); err != nil {
			log.G(ctx).WithError(err).WithField("branch", e.Name()).Warn("delete branch container")
		}
		if err := mount.UnmountRecursive(filepath.Join(bundle, branchesDir, e.Name(), "rootfs"), unix.MNT_DETACH); err != nil {
			log.G(ctx).WithError(err).WithField("branch", e.Name()).Warn("unmount branch rootfs")
		}
	}
}

// killBranchCgroups kills every process in the cgroups below a sandbox's
// (branches, warm inits, the seal leaf), thawing them first. The runtime's
// force delete of the sandbox freezes, kills and thaws the sandbox's
// cgroup, but on cgroup v1 a child frozen by itself (a branch held for a
// commit when the shim died) stays frozen, and its processes with it,
// ignoring SIGKILL. A paused sandbox is killed whole and thawed first.
func killBranchCgroups(ctx context.Context, bundle string) {
	spec, err := readSpec(bundle)
	if err != nil || spec.Linux == nil {
		return
	}
	cg, err := sandboxCgroup(spec.Linux.CgroupsPath)
	if err != nil {
		return
	}
	killCgroupsBelow(ctx, cg)
}

// killCgroupsBelow is killBranchCgroups for the sandbox cgroup sbPath (a
// cgroupfs path: sandboxCgroup's).
func killCgroupsBelow(ctx context.Context, sbPath string) {
	ms, err := cgroupMounts()
	if err != nil {
		log.G(ctx).WithError(err).Warn("list cgroup hierarchies")
		return
	}
	sbDirs := dirsIn(ms, sbPath)
	if len(sbDirs) > 0 && cgroupFrozen(sbDirs) {
		// Paused: thawing a branch below the frozen sandbox does nothing.
		// Everything is killed while frozen (a frozen task takes a
		// pending SIGKILL as it thaws, before it runs again), then
		// thawed; the force delete that follows kills the sandbox anyway.
		if err := signalAll(ctx, sbDirs); err != nil {
			log.G(ctx).WithError(err).Warn("kill the processes of a paused sandbox at once")
		}
		thaw(sbDirs)
	}
	seen := map[string]bool{}
	for _, d := range sbDirs {
		entries, _ := os.ReadDir(d.dir)
		for _, e := range entries {
			if !e.IsDir() || seen[e.Name()] {
				continue
			}
			seen[e.Name()] = true
			path := sbPath + "/" + e.Name()
			if err := killDirs(ctx, path, dirsIn(ms, path)); err != nil {
				log.G(ctx).WithError(err).WithField("cgroup", path).Warn("kill branch processes")
			}
		}
	}
}
