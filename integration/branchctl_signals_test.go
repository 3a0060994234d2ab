//go:build linux

package integration

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/client"
)

// TestBranchctlExecSignals: a signal that stops `branchctl exec` (a
// supervisor's SIGTERM, Ctrl-C without a terminal) is passed to the
// command and what it started, and branchctl exits with the command's
// status; before, branchctl died and the command ran on in the branch. A
// shell's background job ignores SIGINT: a second one kills it.
func TestBranchctlExecSignals(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	b := kids[0].ID
	// running lists the branch's processes' command lines.
	running := func() string {
		out, _ := run(t, ctx, sc, b, "ps", "-o", "args")
		return out
	}
	// start runs branchctl exec of script; its exit (ended closed, err
	// set) is waited for when the test ends too.
	type ctl struct {
		cmd    *exec.Cmd
		stderr bytes.Buffer
		ended  chan struct{}
		err    error
	}
	start := func(script string) *ctl {
		c := &ctl{ended: make(chan struct{})}
		c.cmd = exec.Command(filepath.Join(env.BinDir, "branchctl"), "exec", "sb/"+b, "--", "sh", "-c", script)
		c.cmd.Env = append(os.Environ(), "CONTAINERD_ADDRESS="+env.Address, "CONTAINERD_NAMESPACE="+env.Namespace)
		c.cmd.Stderr = &c.stderr
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			c.err = c.cmd.Wait()
			close(c.ended)
		}()
		t.Cleanup(func() {
			_ = c.cmd.Process.Kill()
			<-c.ended
		})
		return c
	}
	code := func(err error) int {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		t.Fatalf("branchctl exec: %v", err)
		return 0
	}
	awaitExit := func(c *ctl) int {
		t.Helper()
		select {
		case <-c.ended:
			return code(c.err)
		case <-time.After(30 * time.Second):
			t.Fatalf("branchctl exec still runs 30 s after the signal: %s", c.stderr.String())
			return 0
		}
	}

	// SIGTERM: the shell, its command and its background job end.
	c := start("sleep 3101 & sleep 3102; echo not reached")
	waitFor(t, func() bool { return strings.Contains(running(), "sleep 3102") })
	if err := c.cmd.Process.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := awaitExit(c); code != 128+int(unix.SIGTERM) {
		t.Fatalf("branchctl exec after SIGTERM: exit %d, want the command's 143: %s", code, c.stderr.String())
	}
	if !strings.Contains(c.stderr.String(), "passed to the command") {
		t.Fatalf("branchctl exec did not say it passed the signal: %q", c.stderr.String())
	}
	waitFor(t, func() bool { return !strings.Contains(running(), "sleep 310") })

	// SIGINT: the shell and its command end, the background job (which
	// ignores it) holds the output; the second kills it.
	c = start("sleep 3103 & sleep 3104")
	waitFor(t, func() bool { return strings.Contains(running(), "sleep 3104") })
	if err := c.cmd.Process.Signal(unix.SIGINT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !strings.Contains(running(), "sleep 3104") })
	if ps := running(); !strings.Contains(ps, "sleep 3103") {
		t.Fatalf("the background job, which ignores SIGINT, is gone after one: %s", ps)
	}
	if err := c.cmd.Process.Signal(unix.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := awaitExit(c); code != 128+int(unix.SIGINT) {
		t.Fatalf("branchctl exec after two SIGINTs: exit %d, want the shell's 130: %s", code, c.stderr.String())
	}
	if ps := running(); strings.Contains(ps, "sleep 310") {
		t.Fatalf("left running: %s", ps)
	}
}
