//go:build linux

package sandbox

// The branch contexts of the shim's sandboxes: the state the shim keeps
// for each sandbox and each of its contexts. The API is contexts_api.go,
// their life contexts_lifecycle.go, events and the reaper beside them.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/branchbox/branchbox/client/branchapi"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/initdriver"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/runc"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	cshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/containerd/v2/pkg/sys/reaper"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/time/rate"

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

// DefaultRoot is where the runtime keeps container state (runc's is
// /run/containerd/runc), under a directory per containerd namespace.
const DefaultRoot = "/run/containerd/branch"

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

// Service serves the branch context API of every sandbox this shim runs.
type Service struct {
	ctx       context.Context
	self      string
	runtime   string             // the binary branch containers are run with
	inits     *initdriver.Driver // starts branches with the branch init
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

	// The host's cgroup hierarchies, and the clones into limited cgroups.
	cgroups cgroup.Host
}

// hier is the host's cgroup hierarchies.
func (c *Service) hier() ([]cgroup.Dir, error) { return c.cgroups.Mounts() }

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
	pool     *initdriver.Pool // inits started ahead of forks of the root, or nil
	nextID   uint64           // the branch id the snapshotter likely gives next (0: not known)
	initPath initdriver.Path  // how its branches start (initpath.go)
	// releasing counts the removals of ended branches' cgroups and
	// runtime state still going on; Teardown waits for them.
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
	writers    bool               // its last fork found its processes writing (sealwriters.go)
	container  *runc.Container    // run by the runtime; nil for the sandbox
	fast       *initdriver.Branch // run by the branch init; nil for the sandbox
	limits     *shimv1.Limits     // given at fork
	hasCommand bool
	memory     bool // its processes were restored from a memory fork
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

// initConfig is what the branch init's driver needs of branch n of sb.
func (n *bctx) initConfig(sb *sandbox) initdriver.Config {
	return initdriver.Config{ID: n.id, Spec: n.spec, Cgroup: n.cgroup, Limits: n.limits, HasCommand: n.hasCommand, Path: &sb.initPath}
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

func NewService(ctx context.Context, self string, publisher cshim.Publisher, task taskAPI.TTRPCTaskService) (*Service, error) {
	platform, err := runc.NewPlatform()
	if err != nil {
		return nil, fmt.Errorf("branch contexts: console platform: %w", err)
	}
	c := &Service{
		ctx: ctx, self: self, runtime: branchRuntime(self), publisher: publisher, task: task, platform: platform,
		sandboxes: map[string]*sandbox{},
		pids:      map[int]process.Process{},
		pending:   map[int]pendingExit{},
		events:    make(chan queuedEvent, 1024),
	}
	c.inits = &initdriver.Driver{Binary: initdriver.FindBinary(self), Cgroups: &c.cgroups, Watch: c.watch}
	c.nodeBounds, c.nodeBoundsErr = readNodeBounds()
	ec := reaper.Default.Subscribe()
	go c.reap(ec)
	go c.forward()
	return c, nil
}

func (c *Service) Sandbox(id string) (*sandbox, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sb, ok := c.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %s is not a container of this shim: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

func (sb *sandbox) root() branch.Root { return branch.Root{Upperdir: sb.upper} }

func (sb *sandbox) ref(id string) branch.Ref {
	if id == branch.RootID {
		id = ""
	}
	return branch.Ref{Root: sb.root(), Branch: id}
}

func withNS(ctx context.Context, sb *sandbox) context.Context {
	return namespaces.WithNamespace(ctx, sb.ns)
}

// branchCgroup is the cgroup of branch id whose parent context's cgroup
// is parent (abortLost finds a lost branch's by the same rule).
func branchCgroup(parent, id string) string { return parent + "/b" + id }

// descendants lists id's descendants among the running contexts, deepest
// first.
func (sb *sandbox) descendants(id string) []*bctx {
	parents := make(map[string]string, len(sb.nodes))
	for _, n := range sb.nodes {
		if n.id != branch.RootID {
			parents[n.id] = n.parent
		}
	}
	ids := branch.Subtree(id, parents)[1:]
	out := make([]*bctx, 0, len(ids))
	for i := len(ids) - 1; i >= 0; i-- {
		out = append(out, sb.nodes[ids[i]])
	}
	return out
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
