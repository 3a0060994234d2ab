//go:build linux

package mcpserver

// The exec tool: a command run in a branch, its output bounded, its
// progress told to a client that asks for it.

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/ops"
)

// ExecIn is exec's input.
type ExecIn struct {
	Sandbox string   `json:"sandbox,omitempty" jsonschema:"the sandbox (id, id prefix or name); default: the one this server is scoped to"`
	Branch  string   `json:"branch" jsonschema:"the branch to run in: a branch id, or \"0\" for the sandbox itself"`
	Command string   `json:"command,omitempty" jsonschema:"a shell command line, run with /bin/sh -c (give this or args)"`
	Args    []string `json:"args,omitempty" jsonschema:"the program and its arguments, run as they are (give this or command)"`
	Stdin   string   `json:"stdin,omitempty" jsonschema:"the whole standard input"`
	Env     []string `json:"env,omitempty" jsonschema:"more environment variables, KEY=VALUE"`
	Cwd     string   `json:"cwd,omitempty" jsonschema:"working directory"`
	Timeout float64  `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds (default 120)"`
}

// ExecOut is exec's output.
type ExecOut struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"the output was longer than the server returns; only its start is here"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	// Why the process's branch ended, if that killed it.
	BranchEnded string `json:"branch_ended,omitempty" jsonschema:"set when the process was killed because its branch ended (another branch's commit made it stale, or it was aborted): why"`
}

// capped keeps the first max bytes written to it.
type capped struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	max       int
	written   int
	truncated bool
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.written += len(p)
	if room := c.max - c.buf.Len(); len(p) > room {
		c.truncated = true
		c.buf.Write(p[:max(room, 0)])
	} else {
		c.buf.Write(p)
	}
	return len(p), nil
}

// Len is how many bytes were written, those cut off included.
func (c *capped) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.written
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.ToValidUTF8(c.buf.String(), "\uFFFD")
}

// progress tells the client of a call how long its command has run.
type progress func(ctx context.Context, running time.Duration, output int)

// progressOf is the progress of call req, or nil if its client did not ask
// for any (no progressToken).
func progressOf(req *mcp.CallToolRequest) progress {
	tok := req.Params.GetProgressToken()
	if tok == nil || req.Session == nil {
		return nil
	}
	return func(ctx context.Context, running time.Duration, output int) {
		// Lost notifications are not the command's failure: a client
		// that left is seen by the call's context.
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
			ProgressToken: tok,
			Progress:      running.Seconds(),
			Message:       fmt.Sprintf("running for %s, %d bytes of output", running.Round(time.Second), output),
		})
	}
}

// waitReporting waits for p as Wait does, telling report (if not nil)
// every ProgressEvery how long it has run and how much it wrote.
func (s *Server) waitReporting(ctx context.Context, p ops.Process, report progress, output func() int) (client.ExitStatus, error) {
	if report == nil {
		return p.Wait(ctx)
	}
	type result struct {
		st  client.ExitStatus
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := p.Wait(ctx)
		done <- result{st, err}
	}()
	start := time.Now()
	tick := time.NewTicker(s.cfg.ProgressEvery)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			return r.st, r.err
		case <-tick.C:
			report(ctx, time.Since(start), output())
		}
	}
}

func (s *Server) exec(ctx context.Context, in ExecIn, report progress) (ExecOut, error) {
	args := in.Args
	switch {
	case in.Command != "" && len(args) > 0:
		return ExecOut{}, fmt.Errorf("give command or args, not both: %w", errdefs.ErrInvalidArgument)
	case in.Command != "":
		args = []string{"/bin/sh", "-c", in.Command}
	case len(args) == 0:
		return ExecOut{}, fmt.Errorf("no command: give command (a shell line) or args: %w", errdefs.ErrInvalidArgument)
	}
	timeout := s.cfg.DefaultTimeout
	if in.Timeout > 0 {
		timeout = min(time.Duration(in.Timeout*float64(time.Second)), s.cfg.MaxTimeout)
	}
	select {
	case s.execs <- struct{}{}:
		defer func() { <-s.execs }()
	default:
		return ExecOut{}, fmt.Errorf("%d commands are already running, this server's limit: %w", cap(s.execs), errdefs.ErrResourceExhausted)
	}
	done, err := s.startCommand()
	if err != nil {
		return ExecOut{}, err
	}
	defer done()
	sc, err := s.dial(ctx, in.Sandbox)
	if err != nil {
		return ExecOut{}, err
	}
	defer sc.Close()
	stdout, stderr := &capped{max: s.cfg.MaxOutput}, &capped{max: s.cfg.MaxOutput}
	opts := client.ExecOptions{Args: args, Env: in.Env, Cwd: in.Cwd, Stdout: stdout, Stderr: stderr}
	if in.Stdin != "" {
		opts.Stdin = strings.NewReader(in.Stdin)
	}
	p, err := ops.Exec(ctx, s.cc, sc, in.Branch, opts)
	if err != nil {
		return ExecOut{}, err
	}
	// The timeout is the command's run, from its start.
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer context.AfterFunc(s.stopping, cancel)()
	st, err := s.waitReporting(tctx, p, report, func() int { return stdout.Len() + stderr.Len() })
	if err != nil && ops.Ended(tctx) {
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer kcancel()
		_ = p.KillAll(kctx, uint32(unix.SIGKILL))
		_, _ = p.Wait(kctx)
		if s.stopping.Err() != nil {
			return ExecOut{}, fmt.Errorf("%v was killed: the server stopped; its output so far: stdout %q, stderr %q: %w", args, stdout.String(), stderr.String(), errdefs.ErrUnavailable)
		}
		return ExecOut{}, fmt.Errorf("%v ran longer than %s and was killed; its output so far: stdout %q, stderr %q: %w", args, timeout, stdout.String(), stderr.String(), context.DeadlineExceeded)
	}
	if err != nil {
		return ExecOut{}, err
	}
	return ExecOut{ExitCode: st.Code, Stdout: stdout.String(), Stderr: stderr.String(), Truncated: stdout.truncated || stderr.truncated, OOMKilled: st.OOMKilled, BranchEnded: st.BranchEnded}, nil
}
