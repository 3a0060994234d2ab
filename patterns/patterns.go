//go:build linux

package patterns

import (
	"context"
	"time"

	"github.com/branchbox/branchbox/client"
)

// Brancher is what the exploration patterns need of a sandbox: fork
// branches, run commands in them, commit one, abort the rest.
// *client.SandboxClient satisfies it; the patterns' selection logic is tested
// against a fake.
type Brancher interface {
	Fork(ctx context.Context, opts client.ForkOptions) ([]client.BranchInfo, error)
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
	// Parent is the branch it was forked from (RootID: the sandbox).
	Parent string `json:"parent"`
	// Depth is its depth in a search (1: a child of the starting branch).
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
	// Parent is the branch the pattern started from (RootID: the
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
