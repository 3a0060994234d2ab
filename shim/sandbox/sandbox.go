//go:build linux

package sandbox

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client/branchapi"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/initdriver"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/time/rate"
)

// Sandbox is a container this shim created, and its branches.
type Sandbox struct {
	id, ns, bundle string
	upper          string
	opts           *options.Options
	bounds         bounds        // its live-branch, depth and fork-rate bounds (bounds.go)
	forks          *rate.Limiter // its in-sandbox forks, at its fork rate
	calls          *rate.Limiter // calls through its branch sockets, at its call rate
	output         *outputBudget // the output kept for its socket's un-waited processes (insock.go)
	// cgroup is the sandbox's cgroup path, whose freezer says whether it
	// is paused (pause.go); "" if its spec did not say.
	cgroup string

	// mu serializes fork, commit and abort on one sandbox: a commit checks
	// and kills before the snapshotter decides, and must not interleave.
	mu        sync.Mutex
	nodes     map[string]*Branch // branches by id, and "0"
	snapshot  *branchapi.Client
	pool      *initdriver.Pool // inits started ahead of forks of the root, or nil
	nextID    uint64           // the branch id the snapshotter likely gives next (0: not known)
	warming   atomic.Bool      // warm ran: its pool is started, or was not to be (warm.go)
	initPath  initdriver.Path  // how its branches start (initdriver.Path, start.go's useInit)
	releasing releases         // of ended branches (releases.go)
	// starting counts execs starting their process outside mu; a Pause
	// waits for them.
	starting starts

	// gen is the snapshotter client's generation when the branches were
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
	// waited is the answers of Waits that forgot their exec: a caller's
	// Wait that its deadline ended can be answered after the exec's end
	// while the caller asks again (a kill, then Wait), and that Wait
	// must get the same answer, not "not found".
	waited map[string]*shimv1.WaitResponse

	// create is the task's creation as the task service was asked for it
	// (its rootfs aside), to create it again from a memory image
	// (rollbackroot.go); replace is that replacement's state (replace.go).
	create  *taskAPI.CreateTaskRequest
	replace replacement
}

// maxEnded bounds the processes of ended branches kept for Wait.
const maxEnded = 1024

func (sb *Sandbox) keepEnded(branchID string, ps []process.Process) {
	sb.endedMu.Lock()
	defer sb.endedMu.Unlock()
	if sb.ended == nil || len(sb.ended)+len(ps) > maxEnded {
		sb.ended = map[string]process.Process{}
	}
	for _, p := range ps {
		sb.ended[branchID+"/"+p.ID()] = p
	}
}

func (sb *Sandbox) keepWaited(branchID, execID string, resp *shimv1.WaitResponse) {
	sb.endedMu.Lock()
	defer sb.endedMu.Unlock()
	if sb.waited == nil || len(sb.waited) >= maxEnded {
		sb.waited = map[string]*shimv1.WaitResponse{}
	}
	sb.waited[branchID+"/"+execID] = resp
}

func (sb *Sandbox) takeWaited(branchID, execID string) *shimv1.WaitResponse {
	sb.endedMu.Lock()
	defer sb.endedMu.Unlock()
	resp := sb.waited[branchID+"/"+execID]
	delete(sb.waited, branchID+"/"+execID)
	return resp
}

func (sb *Sandbox) takeEnded(branchID, execID string) process.Process {
	sb.endedMu.Lock()
	defer sb.endedMu.Unlock()
	p := sb.ended[branchID+"/"+execID]
	delete(sb.ended, branchID+"/"+execID)
	return p
}

func (sb *Sandbox) root() branch.Root { return branch.Root{Upperdir: sb.upper} }

func (sb *Sandbox) ref(id string) branch.Ref {
	if id == branch.RootID {
		id = ""
	}
	return branch.Ref{Root: sb.root(), Branch: id}
}

func withNS(ctx context.Context, sb *Sandbox) context.Context {
	return namespaces.WithNamespace(ctx, sb.ns)
}

// descendants lists id's descendants among the running branches, deepest
// first.
func (sb *Sandbox) descendants(id string) []*Branch {
	parents := make(map[string]string, len(sb.nodes))
	for _, n := range sb.nodes {
		if n.id != branch.RootID {
			parents[n.id] = n.parent
		}
	}
	ids := branch.Subtree(id, parents)[1:]
	out := make([]*Branch, 0, len(ids))
	for i := len(ids) - 1; i >= 0; i-- {
		out = append(out, sb.nodes[ids[i]])
	}
	return out
}

func ids(ns []*Branch) string {
	var s []string
	for _, n := range ns {
		s = append(s, n.id)
	}
	sort.Slice(s, func(i, j int) bool { a, _ := strconv.Atoi(s[i]); b, _ := strconv.Atoi(s[j]); return a < b })
	return strings.Join(s, ", ")
}

// branchFor finds a running branch; with lock, it returns with the
// sandbox locked. A branch that is not running gets the snapshotter's word
// on what became of it (stale, naming the winner; committed; aborted).
// With write, the operation needs the branch's processes, and a paused
// sandbox is refused (see load).
func (c *Service) branchFor(ctx context.Context, sandboxID, id string, lock, write bool) (*Sandbox, *Branch, error) {
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
				log.G(ctx).WithError(rerr).WithField("sandbox", sb.id).Warn("reconcile branches with the snapshotter")
			}
			err = fmt.Errorf("branch %s of %s was not running here (lost by a crash, or made outside this shim) and was aborted: %w", id, sandboxID, errdefs.ErrNotFound)
		}
		sb.mu.Unlock()
		return nil, nil, err
	}
	if !lock {
		sb.mu.Unlock()
	}
	return sb, n, nil
}

// AddSandbox records a container as it is created; its rootfs mounts name
// its snapshot.
func (c *Service) AddSandbox(ctx context.Context, r *taskAPI.CreateTaskRequest, opts *options.Options, b bounds) {
	ns, _ := namespaces.Namespace(ctx)
	upper := ""
	for _, m := range r.Rootfs {
		for _, o := range m.Options {
			if u, ok := strings.CutPrefix(o, "upperdir="); ok {
				upper = u
			}
		}
	}
	cgPath := ""
	if spec, err := ReadSpec(r.Bundle); err == nil && spec.Linux != nil {
		// Not resolvable: no cgroup of its own to look at (prepare
		// refuses its branches and says why).
		cgPath, _ = cgroup.SandboxPath(spec.Linux.CgroupsPath)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.sandboxes[r.ID]; ok {
		return // added before its creation, to settle it (Create)
	}
	c.sandboxes[r.ID] = &Sandbox{
		id: r.ID, ns: ns, bundle: r.Bundle, upper: upper, opts: opts, cgroup: cgPath, stoppedCh: make(chan struct{}),
		bounds: b, forks: newForkLimiter(b), calls: newCallLimiter(b), output: newOutputBudget(),
		create: &taskAPI.CreateTaskRequest{
			ID: r.ID, Bundle: r.Bundle, Terminal: r.Terminal, Options: r.Options,
			Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr,
		},
	}
}

// load prepares a sandbox for an operation on its branches (under sb.mu):
// the snapshotter connection and the root branch, reconciled with the
// snapshotter's tree on first use and after every reconnection. A paused
// sandbox is refused (pause.go), and so is a caller that gave up while
// the operation waited for the sandbox.
func (c *Service) load(ctx context.Context, sb *Sandbox) error {
	if err := c.view(ctx, sb); err != nil {
		return err
	}
	if c.Paused(sb) {
		return PausedError(sb)
	}
	return nil
}

// view is load for an operation that only reads, or that needs no
// process of a branch (the tree, waits, checkpoints): a paused sandbox is
// answered, but not reconciled until it is resumed.
func (c *Service) view(ctx context.Context, sb *Sandbox) error {
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
	c.warm(ctx, sb)
	return nil
}

// prepare dials the snapshotter and makes the root branch, once.
func (c *Service) prepare(ctx context.Context, sb *Sandbox) error {
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
	addr, err := branchapi.AddressOf(root)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.id, err)
	}
	kick := make(chan struct{}, 1)
	client, err := branchapi.DialNotify(addr, func() { wake(kick) })
	if err != nil {
		return err
	}
	spec, err := ReadSpec(sb.bundle)
	if err != nil {
		client.Close()
		return err
	}
	cg, err := cgroup.SandboxPath(spec.Linux.CgroupsPath)
	if err != nil {
		client.Close()
		return fmt.Errorf("sandbox %s: %w", sb.id, err)
	}
	sb.snapshot = client
	sb.nodes = map[string]*Branch{branch.RootID: {
		id: branch.RootID, bundle: sb.bundle, cgroup: cg, spec: spec, net: NetShared,
	}}
	sb.kick, sb.done = kick, make(chan struct{})
	go c.settle(context.WithoutCancel(ctx), sb)
	if ms, err := c.cgroups.Mounts(); err == nil {
		cgroup.HoldFreezerKey(ms, cg)
	}
	return nil
}

// Sandbox is the sandbox id, if this shim runs it.
func (c *Service) Sandbox(id string) (*Sandbox, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sb, ok := c.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %s is not a container of this shim: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// sync reconciles sb (under sb.mu) if it never was, or if the snapshotter
// connection was lost since it last was. A snapshotter that does not
// answer is left to the settle loop: the operation under way reports its
// own error if it needs the snapshotter.
func (c *Service) sync(ctx context.Context, sb *Sandbox) {
	if sb.reconciled && sb.snapshot.Generation() == sb.gen {
		return
	}
	if err := c.reconcile(ctx, sb); err != nil {
		log.G(ctx).WithError(err).WithField("sandbox", sb.id).Debug("reconcile branches: snapshotter not answering; retrying in the background")
		wake(sb.kick)
	}
}

// Paused says whether a sandbox's cgroup is frozen or freezing.
func (c *Service) Paused(sb *Sandbox) bool {
	if sb.cgroup == "" {
		return false
	}
	return c.cgroups.Frozen(sb.cgroup)
}
