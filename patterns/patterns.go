//go:build linux

package patterns

import (
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"

	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// Brancher is what the exploration patterns need of a sandbox: fork
// contexts, run commands in them, commit one, abort the rest.
// *client.SandboxClient satisfies it; the patterns' selection logic is tested
// against a fake.
type Brancher interface {
	Fork(ctx context.Context, opts client.ForkOptions) ([]client.ContextInfo, error)
	Run(ctx context.Context, branch string, opts client.ExecOptions) (client.ExitStatus, error)
	Commit(ctx context.Context, branch string) (client.SandboxCommitResult, error)
	Abort(ctx context.Context, branch string) ([]string, error)
}

var _ Brancher = (*client.SandboxClient)(nil)

// Command is a process to run in a branch: argv (usually sh -c ...) and
// extra environment.
type Command struct {
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`
}

// Options apply to every pattern.
type Options struct {
	// Timeout bounds the whole pattern. When it expires, every branch
	// still running is aborted (outcome timeout), and the pattern decides
	// among what finished: best-of-n commits the best scored attempt,
	// the searches their best node; speculate, reflexion and a tournament
	// whose judging did not finish commit nothing. Zero: no limit.
	Timeout time.Duration
	// BranchTimeout bounds the work in one branch (its command and its
	// scoring; for a tournament, also each judge run), counted from its
	// fork. A branch that exceeds it is aborted (outcome timeout).
	BranchTimeout time.Duration
	// Fork is the template for every fork (Seal, Net, limits); Parent,
	// Count, Args and From are set by the pattern.
	Fork client.ForkOptions
	// Env is added to every command the pattern runs.
	Env []string
}

// Outcome is what became of one attempt.
type Outcome string

const (
	// OutcomeCommitted: its changes are the parent's now.
	OutcomeCommitted Outcome = "committed"
	// OutcomeLost: it succeeded, but another was chosen (or committed
	// first); it was invalidated or aborted.
	OutcomeLost Outcome = "lost"
	// OutcomePruned: a search node that was not kept.
	OutcomePruned Outcome = "pruned"
	// OutcomeFailed: its command exited non-zero, it could not be scored,
	// or running it failed; it was aborted.
	OutcomeFailed Outcome = "failed"
	// OutcomeTimeout: its branch timeout or the overall timeout expired
	// while it ran; it was aborted.
	OutcomeTimeout Outcome = "timeout"
	// OutcomeAborted: the caller's context ended, or the pattern stopped
	// before deciding; it was aborted.
	OutcomeAborted Outcome = "aborted"
)

// AttemptResult is one branch a pattern ran a command in.
type AttemptResult struct {
	// Index numbers attempts in the order their branches were forked.
	Index  int    `json:"index"`
	Branch string `json:"branch,omitempty"`
	// Parent is the context it was forked from (RootID: the sandbox).
	Parent string `json:"parent"`
	// Depth is its depth in a search (1: a child of the starting context).
	Depth int      `json:"depth,omitempty"`
	Args  []string `json:"args"`
	// ExitCode is its command's exit status; -1 if it did not exit (it
	// timed out, or never ran).
	ExitCode int      `json:"exitCode"`
	Score    *float64 `json:"score,omitempty"`
	// Duration is the time spent running and scoring it.
	Duration time.Duration `json:"durationNs"`
	Outcome  Outcome       `json:"outcome"`
	// Error says why it failed, timed out or was aborted.
	Error string `json:"error,omitempty"`
	// Output is the tail of its command's stdout and stderr.
	Output string `json:"output,omitempty"`

	deadline time.Time
	stdout   string // what the command wrote on stdout (capped)
	combined string // its stdout and stderr (capped), for feedback
	expanded bool
	kids     []*AttemptResult
}

// Match is one pairwise judgement of a tournament.
type Match struct {
	Round int `json:"round"`
	// A and B are attempt indexes; Winner is one of them.
	A      int `json:"a"`
	B      int `json:"b"`
	Winner int `json:"winner"`
	// Judge is the branch the judge ran in.
	Judge    string        `json:"judge,omitempty"`
	Duration time.Duration `json:"durationNs"`
	// Error says why the judge gave no verdict (then A, the lower seed,
	// goes on).
	Error string `json:"error,omitempty"`
}

// Result is what a pattern did.
type Result struct {
	Pattern string `json:"pattern"`
	// Parent is the context the pattern started from (RootID: the
	// sandbox).
	Parent   string          `json:"parent"`
	Attempts []AttemptResult `json:"attempts"`
	// Winner is the index of the attempt whose changes were committed,
	// -1 if none.
	Winner int `json:"winner"`
	// Committed is the branch committed into Parent ("" if none); for a
	// search, Path lists the branches from it down to the winner, each
	// committed into the one before.
	Committed string   `json:"committed,omitempty"`
	Path      []string `json:"path,omitempty"`
	Matches   []Match  `json:"matches,omitempty"`
	// TimedOut: the overall timeout expired.
	TimedOut bool          `json:"timedOut,omitempty"`
	Duration time.Duration `json:"durationNs"`
}

// Env variables the patterns set for the commands they run.
const (
	// EnvIndex is the attempt's index (speculate, best-of-n, tournament),
	// its attempt number from 0 (reflexion), or its index among its
	// siblings (searches).
	EnvIndex = "BRANCH_INDEX"
	// EnvDepth is a search node's depth (1 for the first level).
	EnvDepth = "BRANCHBOX_DEPTH"
	// EnvParentScore is the score of a search node's parent, when scored.
	EnvParentScore = "BRANCHBOX_PARENT_SCORE"
	// EnvFeedback names the file holding the previous attempt's output
	// (reflexion, from the second attempt).
	EnvFeedback = "BRANCHBOX_FEEDBACK"
	// EnvFeedbackExit is the previous attempt's exit code, or "timeout".
	EnvFeedbackExit = "BRANCHBOX_FEEDBACK_EXIT"
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
	parentOf map[string]string // branch -> the context it was forked from
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
		return nil, fmt.Errorf("fork %d branches of %s: %w", n, contextName(parent), err)
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
		return out, fmt.Errorf("fork of %s made %d branches, want %d: %w", contextName(parent), len(kids), n, errdefs.ErrUnknown)
	}
	return out, nil
}

func contextName(id string) string {
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

// stopped records why a command in a branch did not finish and aborts
// the branch (unless it already lost to a sibling's commit).
func (e *engine) stopped(a *AttemptResult, err error) {
	var se *branch.StaleError
	switch {
	case e.ctx.Err() != nil:
		a.Outcome, a.Error = OutcomeAborted, "the caller's context ended: "+e.ctx.Err().Error()
	case e.overallExpired():
		a.Outcome, a.Error = OutcomeTimeout, fmt.Sprintf("the overall timeout (%s) expired", e.opts.Timeout)
		e.mu.Lock()
		e.res.TimedOut = true
		e.mu.Unlock()
	case a.expired():
		a.Outcome, a.Error = OutcomeTimeout, fmt.Sprintf("the branch timeout (%s) expired", e.opts.BranchTimeout)
	case errors.As(err, &se):
		a.Outcome, a.Error = OutcomeLost, err.Error()
	default:
		a.Outcome, a.Error = OutcomeFailed, err.Error()
	}
	if a.Outcome != OutcomeLost {
		if aerr := e.abort(a.Branch); aerr != nil {
			a.Error += "; " + aerr.Error()
		}
	}
}

// The shim ends a call at the deadline it was given, which may come back
// before the local context's own timer has fired: so deadlines are judged
// by the clock.
func (e *engine) overallExpired() bool {
	return e.octx.Err() != nil || (!e.deadline.IsZero() && !time.Now().Before(e.deadline))
}

func (a *AttemptResult) expired() bool {
	return !a.deadline.IsZero() && !time.Now().Before(a.deadline)
}

// failed records an attempt that ran but cannot win, and aborts it.
func (e *engine) failed(a *AttemptResult, why string) {
	a.Outcome, a.Error = OutcomeFailed, why
	if err := e.abort(a.Branch); err != nil {
		a.Error += "; " + err.Error()
	}
}

// runAttempt runs c in a's branch and, if it exits 0 and scorer is given,
// scores it. It reports whether the attempt is still a candidate;
// otherwise its outcome is set and its branch aborted.
func (e *engine) runAttempt(a *AttemptResult, c Command, env []string, scorer *Scorer) bool {
	start := time.Now()
	defer func() { a.Duration = time.Since(start) }()
	stdout, st, err := e.exec(a, c, env, nil)
	combined, err := combinedOf(err)
	a.stdout, a.combined, a.Output = stdout, combined, tail(combined, outputTail)
	if err != nil {
		e.stopped(a, err)
		return false
	}
	a.ExitCode = st.Code
	if st.Code != 0 {
		why := fmt.Sprintf("exited with status %d", st.Code)
		if st.OOMKilled {
			why += " (killed by the OOM killer)"
		}
		e.failed(a, why)
		return false
	}
	if scorer == nil {
		return true
	}
	var ok bool
	out := stdout
	switch {
	case len(scorer.Args) > 0:
		if out, ok = e.helper(a, scorer.Args, env, "the score command"); !ok {
			return false
		}
	case scorer.File != "":
		if out, ok = e.helper(a, []string{"cat", scorer.File}, nil, "reading the score file "+scorer.File); !ok {
			return false
		}
	}
	v, err := parseScore(out)
	if err != nil {
		e.failed(a, err.Error())
		return false
	}
	a.Score = &v
	return true
}

// helper runs a command of the pattern's own (scoring, reading a file) in
// a's branch and returns its stdout; if it fails, a fails and is aborted.
func (e *engine) helper(a *AttemptResult, args, env []string, what string) (string, bool) {
	out, st, err := e.exec(a, Command{Args: args}, env, nil)
	combined, err := combinedOf(err)
	if err != nil {
		e.stopped(a, err)
		return "", false
	}
	if st.Code != 0 {
		e.failed(a, fmt.Sprintf("%s exited with status %d: %s", what, st.Code, tail(combined, 200)))
		return "", false
	}
	return out, true
}

// Scorer says how an attempt is scored; higher is better.
type Scorer struct {
	// Args, if set, run in the attempt's branch after its command; the
	// last line of their stdout is the score.
	Args []string `json:"args,omitempty"`
	// File, if set instead, is a file the command wrote in its branch
	// (read there with cat); its last line is the score.
	File string `json:"file,omitempty"`
	// With neither, the last line of the command's own stdout is the
	// score.
}

func (s Scorer) check(pattern string) error {
	if len(s.Args) > 0 && s.File != "" {
		return fmt.Errorf("%s: score by a command or by a file, not both: %w", pattern, errdefs.ErrInvalidArgument)
	}
	return nil
}

// parseScore reads a number from the last non-empty line of out.
func parseScore(out string) (float64, error) {
	s := strings.TrimSpace(out)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = strings.TrimSpace(s[i+1:])
	}
	if s == "" {
		return 0, fmt.Errorf("no score: the output is empty")
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("score %q is not a finite number", s)
	}
	return v, nil
}

// best returns the candidate with the highest score; ties go to the lowest
// index (the first forked).
func best(cands []*AttemptResult) *AttemptResult {
	var b *AttemptResult
	for _, a := range cands {
		if a.Score == nil {
			continue
		}
		if b == nil || *a.Score > *b.Score || (*a.Score == *b.Score && a.Index < b.Index) {
			b = a
		}
	}
	return b
}

func indexEnv(i int) string { return EnvIndex + "=" + strconv.Itoa(i) }

// Speculate runs each attempt in its own branch of parent, concurrently;
// the first to exit 0 is committed, and the others are invalidated by
// that commit (outcome lost) or, if they failed or timed out first,
// aborted. Nothing is committed if none succeeds.
func Speculate(ctx context.Context, s Brancher, parent string, attempts []Command, opts Options) (*Result, error) {
	const pattern = "speculate"
	if len(attempts) == 0 {
		return nil, fmt.Errorf("%s: no attempts: %w", pattern, errdefs.ErrInvalidArgument)
	}
	for i, c := range attempts {
		if err := checkCommand(pattern, fmt.Sprintf("attempt %d", i), c); err != nil {
			return nil, err
		}
	}
	e, cancel, err := newEngine(ctx, s, pattern, parent, opts)
	if err != nil {
		return nil, err
	}
	defer cancel()
	kids, err := e.fork(e.res.Parent, len(attempts), 1, nil, true)
	if err != nil {
		return e.finish(), err
	}
	var (
		decide sync.Mutex
		won    bool
		wg     sync.WaitGroup
		errs   = make([]error, len(kids))
	)
	for i, a := range kids {
		a.Args = attempts[i].Args
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := e.runAttempt(a, attempts[i], []string{indexEnv(i)}, nil)
			// One decision at a time: a success either commits or finds
			// that another has, and a killed attempt is judged only after
			// the commit that killed it is recorded.
			decide.Lock()
			defer decide.Unlock()
			switch {
			case won && (ok || killedByCommit(a)):
				a.Outcome, a.Error = OutcomeLost, ""
			case !ok:
			case e.ctx.Err() != nil:
				e.stopped(a, e.ctx.Err())
			default:
				if err := e.commit(a.Branch); err != nil {
					var se *branch.StaleError
					if errors.As(err, &se) {
						a.Outcome = OutcomeLost
					} else {
						a.Outcome = OutcomeFailed
						errs[i] = err
						_ = e.abort(a.Branch)
					}
					a.Error = err.Error()
					return
				}
				won = true
				a.Outcome = OutcomeCommitted
				e.res.Winner, e.res.Committed = a.Index, a.Branch
			}
		}()
	}
	wg.Wait()
	res := e.finish()
	if err := ctx.Err(); err != nil && res.Winner < 0 {
		return res, err
	}
	return res, errors.Join(errs...)
}

// killedByCommit tells whether an attempt that ended while a sibling
// committed was ended by that commit (SIGKILL, or its branch gone under
// it) rather than failing by itself.
func killedByCommit(a *AttemptResult) bool {
	return a.Outcome == OutcomeLost || a.ExitCode == 128+9 || (a.Outcome == OutcomeFailed && a.ExitCode == -1)
}

// BestOfN runs cmd in n branches of parent concurrently (BRANCH_INDEX=i in
// its environment), scores each that exits 0, and commits the highest
// score (ties: the lowest index). Failed, timed-out and unscorable
// attempts are aborted and never committed.
func BestOfN(ctx context.Context, s Brancher, parent string, n int, cmd Command, score Scorer, opts Options) (*Result, error) {
	e, cancel, err := startN(ctx, s, "best-of-n", parent, n, cmd, opts, score.check("best-of-n"))
	if err != nil {
		return nil, err
	}
	defer cancel()
	kids, err := e.runN(n, cmd, &score, nil)
	if err != nil {
		return e.finish(), err
	}
	if err := e.ctx.Err(); err != nil {
		return e.finish(), err
	}
	err = e.commitBest(kids)
	return e.finish(), err
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

// commitBest commits the best scored candidate among as.
func (e *engine) commitBest(as []*AttemptResult) error {
	var cands []*AttemptResult
	for _, a := range as {
		if a.Outcome == "" {
			cands = append(cands, a)
		}
	}
	w := best(cands)
	if w == nil {
		return nil
	}
	if err := e.commit(w.Branch); err != nil {
		w.Outcome, w.Error = OutcomeFailed, err.Error()
		return err
	}
	w.Outcome = OutcomeCommitted
	e.res.Winner, e.res.Committed = w.Index, w.Branch
	return nil
}
