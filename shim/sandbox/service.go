//go:build linux

package sandbox

// The service of the shim's sandboxes and their branches (the ttrpc API
// shimv1.Branches): what the shim keeps for all of them. A sandbox is
// sandbox.go, a branch branch.go; the operations are fork.go, start.go,
// commit.go, abort.go and end.go, checkpoint.go, exec.go and tree.go.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/initdriver"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/runc"
	cshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/containerd/v2/pkg/sys/reaper"

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

// branchesDir is where, inside the sandbox's bundle, each branch
// has its own bundle (config.json, rootfs mount point, pid files).
const branchesDir = "branches"

// RuntimeBinary is the name of the runtime-only build of this binary
// (cmd/containerd-shim-branch-v1/runtime), looked for beside the shim.
const RuntimeBinary = "containerd-shim-branch-v1-runtime"

// branchRuntime is the binary that runs branches: the runtime-only
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

// Service serves the branch API of every sandbox this shim runs.
type Service struct {
	ctx       context.Context
	self      string
	runtime   string             // the binary branch containers are run with
	inits     *initdriver.Driver // starts branches with the branch init
	publisher cshim.Publisher
	task      taskAPI.TTRPCTaskService
	platform  stdio.Platform

	mu        sync.Mutex
	sandboxes map[string]*Sandbox

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

func NewService(ctx context.Context, self string, publisher cshim.Publisher, task taskAPI.TTRPCTaskService) (*Service, error) {
	platform, err := runc.NewPlatform()
	if err != nil {
		return nil, fmt.Errorf("branches: console platform: %w", err)
	}
	c := &Service{
		ctx: ctx, self: self, runtime: branchRuntime(self), publisher: publisher, task: task, platform: platform,
		sandboxes: map[string]*Sandbox{},
		pids:      map[int]process.Process{},
		pending:   map[int]pendingExit{},
		events:    make(chan queuedEvent, 1024),
	}
	c.inits = &initdriver.Driver{Binary: initdriver.FindBinary(self), Cgroups: &c.cgroups, Watch: c.watch, SharedRoot: initdriver.RootShared()}
	c.nodeBounds, c.nodeBoundsErr = readNodeBounds()
	ec := reaper.Default.Subscribe()
	go c.reap(ec)
	go c.forward()
	return c, nil
}

// toTTRPC carries errdefs kinds, and a stale branch's winner, over ttrpc.
func toTTRPC(err error) error { return branch.ToGRPC(err) }
