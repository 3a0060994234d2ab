//go:build linux

// The processes the env starts: a daemon spawned and waited for, stopped.

package daemons

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// spawn starts a daemon in its own process group with its output in a log
// file under the env's directory and the env's binaries first on PATH (so
// containerd finds the shim).
func (e *Env) spawn(name string, extraEnv []string, path string, args ...string) (*proc, error) {
	if err := os.MkdirAll(e.Dir, 0o700); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(e.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	if e.NetNS != "" {
		// nsenter execs the daemon: its pid is the daemon's.
		args = append([]string{"--net=" + e.NetNS, "--", path}, args...)
		path = "nsenter"
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(append(os.Environ(), "PATH="+e.BinDir+":"+os.Getenv("PATH")), extraEnv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	// The kernel sends Pdeathsig when the thread that started the daemon
	// ends, not the process. A goroutine that ends with its thread locked
	// ends the thread (lockedthread.Go does so after a push's layer
	// writer changed its mount namespace, in a test's own process): a
	// daemon started from that thread earlier would be killed with it. So
	// each is started, and waited for, on a thread locked for as long as
	// it runs, which ends only after it.
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	err = <-started
	logf.Close()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

func (e *Env) waitSocket(ctx context.Context, p *proc, name, socket string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		// Dial rather than stat: a crashed predecessor leaves its socket file.
		if c, err := net.DialTimeout("unix", socket, time.Second); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before serving %s:\n%s", name, p.err, socket, tail(e.Log(name), 20))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not serve %s within 30s", name, socket)
}

// proc is a daemon the harness started; done closes when it has been reaped.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// stop signals p and waits up to timeout, then SIGKILLs it. An exit other
// than a clean one after sig is returned as an error.
func (p *proc) stop(sig syscall.Signal, timeout time.Duration) error {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		if sig == syscall.SIGKILL {
			return nil
		}
		return p.err
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not exit within %s of %s; killed", filepath.Base(p.cmd.Path), timeout, sig)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
