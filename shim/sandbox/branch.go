//go:build linux

package sandbox

import (
	"os"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/shim/cmdlog"
	"github.com/branchbox/branchbox/shim/initdriver"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/runc"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// Branch is one node of a sandbox's tree: the sandbox itself (its root,
// "0") or a branch.
type Branch struct {
	id, parent string
	runtimeID  string
	bundle     string
	cgroup     string
	spec       *specs.Spec
	net        string
	seal       string // how this branch is sealed while it has children
	state      state
	writers    bool               // its last fork found its processes writing (sealwriters.go)
	container  *runc.Container    // run by the runtime; nil for the sandbox
	init       *initdriver.Branch // run by the branch init; nil for the sandbox
	rootfs     *os.File           // its init's rootfs mount, held until its release (holdRootfs)
	mntns      *os.File           // its init's mount namespace, held likewise (holdMntns)
	limits     *shimv1.Limits     // given at fork
	hasCommand bool
	memory     bool        // its processes were restored from a memory fork
	output     *cmdlog.Log // the runtime's processes' output, copied to init.log
}

// state is where a branch is in its life, beyond running: conditions
// that can hold together (a branch whose command exited can be held for
// its commit; the processes of a parent frozen for its branches can be
// killed, and its command exit), each set and cleared under the
// sandbox's lock.
type state uint8

const (
	// sealFrozen: its own processes are frozen while it has branches
	// (--seal freeze, or a fork that found them writing: sealwriters.go);
	// unsealIfIdle thaws them when its last branch ends.
	sealFrozen state = 1 << iota
	// held: frozen for a commit whose outcome is not known yet; killed
	// once the snapshotter decided it, thawed if it did not (commit.go).
	held
	// exited: the command it was forked with (or restored) exited, and
	// nothing of it runs; a rollback with memory runs it again.
	exited
)

// has says whether any of the conditions of c holds.
func (s state) has(c state) bool { return s&c != 0 }

func (s *state) set(c state)   { *s |= c }
func (s *state) clear(c state) { *s &^= c }

// branchProcs is what a running branch's processes are kept by: the
// runtime's container or the branch init.
type branchProcs interface {
	Pid() int
	Process(execID string) (process.Process, error)
}

// initConfig is what the branch init's driver needs of branch n of sb.
func (n *Branch) initConfig(sb *Sandbox) initdriver.Config {
	return initdriver.Config{ID: n.id, Spec: n.spec, Cgroup: n.cgroup, Limits: n.limits, HasCommand: n.hasCommand, Path: &sb.initPath}
}

// procs is the branch's processes, nil for the sandbox or a branch whose
// processes are gone.
func (n *Branch) procs() branchProcs {
	switch {
	case n.init != nil:
		return n.init
	case n.container != nil:
		return n.container
	}
	return nil
}

// branchCgroup is the cgroup of branch id whose parent branch's cgroup
// is parent (abortLost finds a lost branch's by the same rule).
func branchCgroup(parent, id string) string { return parent + "/b" + id }

// branchName names branch id in messages: "the sandbox" for its root.
func branchName(id string) string {
	if id == branch.RootID {
		return "the sandbox"
	}
	return "branch " + id
}
