//go:build linux

package shim

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer/specconv"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/branchbox/branchbox/shim/seccompbpf"
)

// initPath is how a sandbox's branches are started, decided at its first
// fork: by the branch init, or by the runtime, and why. It holds the
// sandbox's seccomp profile compiled for the init, once: compiling
// containerd's default profile with libseccomp takes about 20 ms, several
// times a branch's start.
type initPath struct {
	mu      sync.Mutex
	logged  string              // the reason last logged ("" for the init), or "-" before the first
	profile *specs.LinuxSeccomp // what prog was compiled from
	prog    *compiledSeccomp
	progErr error
}

// compiledSeccomp is a profile compiled for the branch init.
type compiledSeccomp struct {
	flags uint   // SECCOMP_FILTER_FLAG_*
	hex   string // the program as the init takes it
	len   int    // its instructions
}

// useInit says whether the branch of spec is started by the branch init,
// and logs, once per sandbox (and again if the answer changes), which way
// its branches go and why.
func (c *contexts) useInit(ctx context.Context, sb *sandbox, spec *specs.Spec) bool {
	reason := ""
	if c.init == "" {
		reason = "the branch init (" + InitBinary + ") is not installed beside the shim"
	} else if sb.opts != nil && sb.opts.NoPivotRoot {
		reason = "runtime option NoPivotRoot: the branch init always pivots"
	} else if reason = fastUnsupported(spec); reason == "" && spec.Linux.Seccomp != nil {
		if _, err := sb.initPath.seccomp(ctx, spec.Linux.Seccomp); err != nil {
			reason = "seccomp profile not compiled for the branch init: " + err.Error()
		}
	}
	sb.initPath.log(ctx, sb.id, reason, spec.Linux.Seccomp != nil)
	return reason == ""
}

func (p *initPath) log(ctx context.Context, sandboxID, reason string, seccomp bool) {
	p.mu.Lock()
	first := p.logged == ""
	if !first && p.logged[1:] == reason {
		p.mu.Unlock()
		return
	}
	p.logged = "+" + reason
	p.mu.Unlock()
	l := log.G(ctx).WithField("sandbox", sandboxID)
	if reason == "" {
		l.WithField("seccomp", seccomp).Info("branches of this sandbox are started by the branch init")
		return
	}
	l.WithField("reason", reason).Info("branches of this sandbox are started by the runtime (slower): the branch init does not apply what its spec asks")
}

// seccomp returns the program of profile, compiled at the first call.
// Every branch spec of a sandbox shares its profile (branchSpec copies the
// linux section shallowly), so one sandbox compiles once.
func (p *initPath) seccomp(ctx context.Context, profile *specs.LinuxSeccomp) (*compiledSeccomp, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.profile == profile {
		return p.prog, p.progErr
	}
	started := time.Now()
	p.profile, p.prog, p.progErr = profile, nil, nil
	cfg, err := specconv.SetupSeccomp(profile)
	if err != nil {
		p.progErr = fmt.Errorf("convert: %w", err)
	} else if cfg == nil {
		// runc takes a profile with no default action and no rules as
		// no seccomp at all.
		return nil, nil
	} else {
		var prog *seccompbpf.Program
		if prog, p.progErr = seccompbpf.Compile(cfg); p.progErr == nil {
			p.prog = &compiledSeccomp{flags: prog.Flags, hex: prog.Hex(), len: len(prog.Filter)}
		}
	}
	if p.progErr == nil {
		log.G(ctx).WithField("instructions", p.prog.len).WithField("took", time.Since(started)).Debug("compiled the sandbox's seccomp profile for the branch init")
	}
	return p.prog, p.progErr
}

// seccompNotifies says whether a profile hands syscalls to a user-space
// agent, which the runtime connects to the filter's listener.
func seccompNotifies(s *specs.LinuxSeccomp) bool {
	if s.ListenerPath != "" || s.DefaultAction == specs.ActNotify {
		return true
	}
	for _, c := range s.Syscalls {
		if c.Action == specs.ActNotify {
			return true
		}
	}
	return false
}

// seccompPlan has the init install prog in every process it starts, where
// runc would (see brinit.c).
func seccompPlan(w *cfgWriter, prog *compiledSeccomp) {
	if prog == nil {
		return
	}
	w.op("seccomp", strconv.FormatUint(uint64(prog.flags), 10), prog.hex)
}
