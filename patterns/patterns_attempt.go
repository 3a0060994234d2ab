//go:build linux

package patterns

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
)

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
