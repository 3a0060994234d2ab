//go:build linux

package patterns

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

const (
	// stdoutCap bounds what is kept of a command's stdout (candidates and
	// scores are read from its end); feedbackCap its combined output.
	stdoutCap   = 1 << 20
	feedbackCap = 64 << 10
	outputTail  = 2 << 10
	// cleanupTimeout bounds each abort made after the caller's context
	// ended, so that cleanup cannot hang.
	cleanupTimeout = time.Minute
)

// engine holds what one pattern run made and decided; every branch it
// forks is recorded so that it is committed or aborted before the pattern
// returns.
type engine struct {
	s    Brancher
	opts Options
	// ctx is the caller's; octx adds the overall timeout.
	ctx      context.Context
	octx     context.Context
	deadline time.Time // of the overall timeout
	res      *Result
	started  time.Time

	mu       sync.Mutex
	attempts []*AttemptResult
	made     []string          // branches in fork order
	parentOf map[string]string // branch -> the branch it was forked from
	byBranch map[string]*AttemptResult
	ended    map[string]bool
}

func newEngine(ctx context.Context, s Brancher, pattern, parent string, opts Options) (*engine, context.CancelFunc, error) {
	if s == nil {
		return nil, nil, fmt.Errorf("%s: no sandbox: %w", pattern, errdefs.ErrInvalidArgument)
	}
	if opts.Timeout < 0 || opts.BranchTimeout < 0 {
		return nil, nil, fmt.Errorf("%s: timeouts must not be negative: %w", pattern, errdefs.ErrInvalidArgument)
	}
	if parent == "" {
		parent = branch.RootID
	}
	e := &engine{
		s: s, opts: opts, ctx: ctx, started: time.Now(),
		res:      &Result{Pattern: pattern, Parent: parent, Winner: -1},
		parentOf: map[string]string{}, byBranch: map[string]*AttemptResult{}, ended: map[string]bool{},
	}
	cancel := func() {}
	e.octx = ctx
	if opts.Timeout > 0 {
		e.deadline = e.started.Add(opts.Timeout)
		e.octx, cancel = context.WithDeadline(ctx, e.deadline)
	}
	return e, cancel, nil
}

func checkCommand(pattern, what string, c Command) error {
	if len(c.Args) == 0 {
		return fmt.Errorf("%s: %s has no command: %w", pattern, what, errdefs.ErrInvalidArgument)
	}
	return nil
}

// startN checks the arguments of best-of-n and tournament (more is their
// own check) and starts the engine.
func startN(ctx context.Context, s Brancher, pattern, parent string, n int, cmd Command, opts Options, more error) (*engine, context.CancelFunc, error) {
	if n < 1 {
		return nil, nil, fmt.Errorf("%s: n must be at least 1, got %d: %w", pattern, n, errdefs.ErrInvalidArgument)
	}
	if err := checkCommand(pattern, "the attempt", cmd); err != nil {
		return nil, nil, err
	}
	if more != nil {
		return nil, nil, more
	}
	return newEngine(ctx, s, pattern, parent, opts)
}

// runN forks n attempts of cmd and runs them concurrently (BRANCH_INDEX=i),
// scoring each that succeeds if scorer is given, then calling then, if
// given, on each still in the running.
func (e *engine) runN(n int, cmd Command, scorer *Scorer, then func(a *AttemptResult)) ([]*AttemptResult, error) {
	kids, err := e.fork(e.res.Parent, n, 1, cmd.Args, true)
	if err != nil {
		return nil, err
	}
	e.runAll(kids, func(i int, a *AttemptResult) {
		if e.runAttempt(a, cmd, []string{indexEnv(i)}, scorer) && then != nil {
			then(a)
		}
	})
	return kids, nil
}

// fork makes n branches of parent and an attempt for each; with record
// false (a judge's branch) the attempt is not listed in the result.
func (e *engine) fork(parent string, n, depth int, args []string, record bool) ([]*AttemptResult, error) {
	fo := e.opts.Fork
	fo.Parent, fo.Count, fo.Args, fo.From = parent, n, nil, ""
	if parent == branch.RootID {
		fo.Parent = ""
	}
	kids, err := e.s.Fork(e.octx, fo)
	if err != nil {
		return nil, fmt.Errorf("fork %d branches of %s: %w", n, branchName(parent), err)
	}
	var deadline time.Time
	if e.opts.BranchTimeout > 0 {
		deadline = time.Now().Add(e.opts.BranchTimeout)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*AttemptResult, len(kids))
	for i, k := range kids {
		e.made = append(e.made, k.ID)
		e.parentOf[k.ID] = parent
		out[i] = &AttemptResult{
			Index: -1, Branch: k.ID, Parent: parent, Depth: depth, Args: args, ExitCode: -1, deadline: deadline,
		}
		if record {
			out[i].Index = len(e.attempts)
			e.attempts = append(e.attempts, out[i])
			e.byBranch[k.ID] = out[i]
		}
	}
	if len(kids) != n {
		return out, fmt.Errorf("fork of %s made %d branches, want %d: %w", branchName(parent), len(kids), n, errdefs.ErrUnknown)
	}
	return out, nil
}

func branchName(id string) string {
	if id == "" || id == branch.RootID {
		return "the sandbox"
	}
	return "branch " + id
}

// markEnded records branches (and what the engine made below them) as
// gone. Called with e.mu held.
func (e *engine) markEnded(ids ...string) {
	for _, id := range ids {
		e.ended[id] = true
	}
	for changed := true; changed; {
		changed = false
		for _, id := range e.made {
			if !e.ended[id] && e.ended[e.parentOf[id]] {
				e.ended[id] = true
				changed = true
			}
		}
	}
}

func (e *engine) isEnded(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ended[id]
}

// abort kills and discards a branch and what it holds. It works after the
// caller's context ended: no branch is left behind.
func (e *engine) abort(id string) error {
	if e.isEnded(id) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.ctx), cleanupTimeout)
	defer cancel()
	gone, err := e.s.Abort(ctx, id)
	var se *branch.StaleError
	if err != nil && !errors.As(err, &se) && !errdefs.IsNotFound(err) {
		log.G(e.ctx).WithError(err).WithField("branch", id).Warn("abort of an exploration branch failed")
		return fmt.Errorf("abort branch %s: %w", id, err)
	}
	e.mu.Lock()
	e.markEnded(append(gone, id)...)
	e.mu.Unlock()
	return nil
}

// commit commits a branch into its parent, with the caller's context (not
// the overall timeout's: a decision made in time is carried out).
func (e *engine) commit(id string) error {
	res, err := e.s.Commit(e.ctx, id)
	if err != nil {
		var se *branch.StaleError
		if errors.As(err, &se) {
			e.mu.Lock()
			e.markEnded(id)
			e.mu.Unlock()
		}
		return fmt.Errorf("commit branch %s: %w", id, err)
	}
	e.mu.Lock()
	e.markEnded(append(res.Invalidated, id)...)
	e.mu.Unlock()
	return nil
}

// finish aborts every branch still live, settles the outcome of every
// attempt, and fills in the result.
func (e *engine) finish() *Result {
	e.mu.Lock()
	made := append([]string(nil), e.made...)
	e.mu.Unlock()
	// Fork order puts ancestors first, and aborting one ends its subtree.
	for _, id := range made {
		_ = e.abort(id)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	res := e.res
	res.Attempts = make([]AttemptResult, len(e.attempts))
	for i, a := range e.attempts {
		if a.Outcome == "" {
			switch {
			case res.Winner >= 0:
				a.Outcome = OutcomeLost
			case e.ctx.Err() != nil:
				a.Outcome, a.Error = OutcomeAborted, "the caller's context ended: "+e.ctx.Err().Error()
			case res.TimedOut:
				a.Outcome, a.Error = OutcomeTimeout, fmt.Sprintf("the overall timeout (%s) expired before a decision", e.opts.Timeout)
			default:
				a.Outcome, a.Error = OutcomeAborted, "the pattern ended without choosing it"
			}
		}
		res.Attempts[i] = *a
	}
	res.Duration = time.Since(e.started)
	return res
}

// exec runs a command in an attempt's branch within its deadline and the
// overall timeout. It returns the command's stdout (its last stdoutCap
// bytes).
func (e *engine) exec(a *AttemptResult, c Command, env []string, stdin []byte) (string, client.ExitStatus, error) {
	ctx := e.octx
	if !a.deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, a.deadline)
		defer cancel()
	}
	stdout := &tailBuffer{max: stdoutCap}
	combined := &tailBuffer{max: feedbackCap}
	opts := client.ExecOptions{
		Args:   c.Args,
		Env:    append(append(append([]string{}, e.opts.Env...), c.Env...), env...),
		Stdout: multiWriter{stdout, combined},
		Stderr: combined,
	}
	if stdin != nil {
		opts.Stdin = strings.NewReader(string(stdin))
	}
	st, err := e.s.Run(ctx, a.Branch, opts)
	return stdout.String(), st, withCombined(combined.String(), err)
}

type combinedErr struct {
	out string
	err error
}

func (c *combinedErr) Error() string { return c.err.Error() }
func (c *combinedErr) Unwrap() error { return c.err }

func withCombined(out string, err error) error {
	return &combinedErr{out: out, err: err}
}

func combinedOf(err error) (string, error) {
	var c *combinedErr
	if errors.As(err, &c) {
		return c.out, c.err
	}
	return "", err
}

// runAll runs f for each attempt concurrently and waits.
func (e *engine) runAll(as []*AttemptResult, f func(i int, a *AttemptResult)) {
	var wg sync.WaitGroup
	for i, a := range as {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i, a)
		}()
	}
	wg.Wait()
}
