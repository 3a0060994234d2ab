//go:build linux

package initdriver

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer/specconv"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/shim/brinit"
	"github.com/branchbox/branchbox/shim/seccompbpf"
)

// Path is how a sandbox's branches are started, decided at its first
// fork: by the branch init, or by the runtime, and why. It holds the
// sandbox's seccomp profile compiled for the init, once: compiling
// containerd's default profile with libseccomp takes about 20 ms, several
// times a branch's start.
type Path struct {
	mu      sync.Mutex
	logged  string              // the reason last logged ("" for the init), or "-" before the first
	profile *specs.LinuxSeccomp // what prog was compiled from
	prog    *Seccomp
	progErr error
}

// Seccomp is a profile compiled for the branch init.
type Seccomp struct {
	brinit.Seccomp // its filter flags and length
	// file holds the program's instructions, sealed: every init is
	// handed it with its config (containerd's default profile is 10 KB of
	// instructions, which as config text cost every branch a fraction of
	// a millisecond to write, copy and parse).
	file *os.File
}

// sealedProgram puts a program into a memfd sealed against any change.
func sealedProgram(prog []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("branchbox-seccomp", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd for the seccomp program: %w", err)
	}
	f := os.NewFile(uintptr(fd), "branchbox-seccomp")
	if _, err := f.Write(prog); err != nil {
		f.Close()
		return nil, fmt.Errorf("write the seccomp program: %w", err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal the seccomp program: %w", err)
	}
	return f, nil
}

func (p *Path) Log(ctx context.Context, sandboxID, reason string, seccomp bool) {
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

// Seccomp returns the program of profile, compiled at the first call.
// Every branch spec of a sandbox shares its profile (branchSpec copies the
// linux section shallowly), so one sandbox compiles once.
func (p *Path) Seccomp(ctx context.Context, profile *specs.LinuxSeccomp) (*Seccomp, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.profile == profile {
		return p.prog, p.progErr
	}
	started := time.Now()
	p.closeProg()
	p.profile, p.progErr = profile, nil
	cfg, err := specconv.SetupSeccomp(profile)
	if err != nil {
		p.progErr = fmt.Errorf("convert: %w", err)
	} else if cfg == nil {
		// runc takes a profile with no default action and no rules as
		// no seccomp at all.
		return nil, nil
	} else {
		var prog *seccompbpf.Program
		var file *os.File
		if prog, p.progErr = seccompbpf.Compile(cfg); p.progErr == nil {
			if file, p.progErr = sealedProgram(prog.Bytes()); p.progErr == nil {
				p.prog = &Seccomp{Seccomp: brinit.Seccomp{Flags: prog.Flags, Len: len(prog.Filter)}, file: file}
			}
		}
	}
	if p.progErr == nil {
		log.G(ctx).WithField("instructions", p.prog.Len).WithField("took", time.Since(started)).Debug("compiled the sandbox's seccomp profile for the branch init")
	}
	return p.prog, p.progErr
}

// Close lets the compiled program go, with its sandbox.
func (p *Path) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeProg()
	p.profile, p.progErr = nil, nil
}

func (p *Path) closeProg() {
	if p.prog != nil {
		p.prog.file.Close()
		p.prog = nil
	}
}
