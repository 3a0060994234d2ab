//go:build linux

package patterns

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// Judge decides a tournament's pairwise matches.
//
// It runs in a judge branch: a sibling of the attempts, forked from the
// tournament's parent once the attempts have finished (so it sees the
// parent's state, not any candidate's), and forked again only if a judge
// run times out. Each match writes the two candidates into that branch as
// files and runs Args there with BRANCHBOX_A and BRANCHBOX_B naming them
// (BRANCHBOX_A_INDEX and BRANCHBOX_B_INDEX: their attempt indexes). The last
// line of the judge's stdout, "a" or "b" (any case), names the winner. A
// judge that exits non-zero, says anything else or times out gives no
// verdict: A, the lower seed, goes on, and the match records why. The judge
// branch is never committed.
type Judge struct {
	Args []string `json:"args"`
	// File, if set, is the candidate: a file each attempt wrote, read in
	// its branch with cat. Otherwise the candidate is its stdout.
	File string `json:"file,omitempty"`
}

// Env variables a judge gets.
const (
	EnvJudgeA      = "BRANCHBOX_A"
	EnvJudgeB      = "BRANCHBOX_B"
	EnvJudgeAIndex = "BRANCHBOX_A_INDEX"
	EnvJudgeBIndex = "BRANCHBOX_B_INDEX"
)

func candidatePath(i int) string { return "/.branchbox-candidate-" + strconv.Itoa(i) }

// Tournament runs cmd in n branches of parent concurrently (BRANCH_INDEX=i),
// then judges the attempts that exited 0 in a single-elimination bracket:
// round by round, in index order, each pair is judged and the loser
// aborted (an odd one out goes on unjudged). The last one standing is
// committed.
func Tournament(ctx context.Context, s Brancher, parent string, n int, cmd Command, judge Judge, opts Options) (*Result, error) {
	const pattern = "tournament"
	e, cancel, err := startN(ctx, s, pattern, parent, n, cmd, opts, checkCommand(pattern, "the judge", Command{Args: judge.Args}))
	if err != nil {
		return nil, err
	}
	defer cancel()
	var then func(a *AttemptResult)
	if judge.File != "" {
		then = func(a *AttemptResult) {
			if out, ok := e.helper(a, []string{"cat", judge.File}, nil, "reading the candidate file "+judge.File); ok {
				a.stdout = out
			}
		}
	}
	kids, err := e.runN(n, cmd, nil, then)
	if err != nil {
		return e.finish(), err
	}
	if err := e.ctx.Err(); err != nil {
		return e.finish(), err
	}
	var alive []*AttemptResult
	for _, a := range kids {
		if a.Outcome == "" {
			alive = append(alive, a)
		}
	}
	var jb *AttemptResult
	for round := 1; len(alive) > 1; round++ {
		var next []*AttemptResult
		for i := 0; i+1 < len(alive); i += 2 {
			a, b := alive[i], alive[i+1]
			m, stop, err := e.match(round, a, b, judge, &jb)
			if stop || err != nil {
				// Undecided: nothing is committed.
				res := e.finish()
				if err == nil {
					err = ctx.Err()
				}
				return res, err
			}
			e.res.Matches = append(e.res.Matches, m)
			w, l := a, b
			if m.Winner == b.Index {
				w, l = b, a
			}
			l.Outcome, l.Error = OutcomeLost, fmt.Sprintf("lost to attempt %d in round %d", w.Index, round)
			_ = e.abort(l.Branch)
			next = append(next, w)
		}
		if len(alive)%2 == 1 {
			next = append(next, alive[len(alive)-1])
		}
		alive = next
	}
	if jb != nil {
		_ = e.abort(jb.Branch)
	}
	if len(alive) == 1 {
		w := alive[0]
		if err := e.commit(w.Branch); err != nil {
			w.Outcome, w.Error = OutcomeFailed, err.Error()
			return e.finish(), err
		}
		w.Outcome = OutcomeCommitted
		e.res.Winner, e.res.Committed = w.Index, w.Branch
	}
	return e.finish(), nil
}

// match judges a against b in the judge branch *jb, forking one if there
// is none. stop reports that the overall timeout or the caller's context
// ended the tournament.
func (e *engine) match(round int, a, b *AttemptResult, judge Judge, jb **AttemptResult) (m Match, stop bool, err error) {
	m = Match{Round: round, A: a.Index, B: b.Index, Winner: a.Index}
	start := time.Now()
	defer func() { m.Duration = time.Since(start) }()
	if e.overallExpired() {
		e.markTimedOut()
		return m, true, nil
	}
	if *jb == nil {
		kids, err := e.fork(e.res.Parent, 1, 0, judge.Args, false)
		if err != nil {
			if e.overallExpired() {
				e.markTimedOut()
				return m, true, nil
			}
			return m, true, fmt.Errorf("judge: %w", err)
		}
		*jb = kids[0]
	}
	j := *jb
	m.Judge = j.Branch
	if e.opts.BranchTimeout > 0 {
		j.deadline = time.Now().Add(e.opts.BranchTimeout)
	}
	fail := func(err error) (Match, bool, error) {
		switch {
		case e.overallExpired():
			e.markTimedOut()
			return m, true, nil
		case j.expired():
			m.Error = fmt.Sprintf("the judge timed out (branch timeout %s)", e.opts.BranchTimeout)
			_ = e.abort(j.Branch)
			*jb = nil
		default:
			m.Error = err.Error()
		}
		return m, false, nil
	}
	for _, c := range []*AttemptResult{a, b} {
		_, st, err := e.exec(j, Command{Args: writeFileArgs(candidatePath(c.Index), []byte(c.stdout))}, nil, nil)
		if _, err = combinedOf(err); err == nil && st.Code != 0 {
			err = fmt.Errorf("writing candidate %d into the judge's branch exited with status %d", c.Index, st.Code)
		}
		if err != nil {
			return fail(err)
		}
	}
	env := []string{
		EnvJudgeA + "=" + candidatePath(a.Index), EnvJudgeB + "=" + candidatePath(b.Index),
		EnvJudgeAIndex + "=" + strconv.Itoa(a.Index), EnvJudgeBIndex + "=" + strconv.Itoa(b.Index),
	}
	out, st, err := e.exec(j, Command{Args: judge.Args}, env, nil)
	combined, err := combinedOf(err)
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("the judge exited with status %d: %s", st.Code, tail(combined, 200))
	}
	if err != nil {
		return fail(err)
	}
	verdict := strings.TrimSpace(out)
	if i := strings.LastIndexByte(verdict, '\n'); i >= 0 {
		verdict = strings.TrimSpace(verdict[i+1:])
	}
	switch strings.ToLower(verdict) {
	case "a":
	case "b":
		m.Winner = b.Index
	default:
		m.Error = fmt.Sprintf("the judge said %q, not a or b", verdict)
	}
	return m, false, nil
}

// markTimedOut records that the overall timeout stopped the pattern
// (unless the caller's context ended first).
func (e *engine) markTimedOut() {
	if e.ctx.Err() == nil {
		e.mu.Lock()
		e.res.TimedOut = true
		e.mu.Unlock()
	}
}

// FeedbackPath is where reflexion writes the previous attempt's output in
// the next attempt's branch (removed again before that attempt commits).
const FeedbackPath = "/.branchbox-feedback"

// Reflexion runs cmd in a branch of parent; if it fails (or times out),
// the branch is aborted and cmd runs again in a fresh branch, with the
// previous attempt's stdout and stderr in the file BRANCHBOX_FEEDBACK names
// and its exit code (or "timeout") in BRANCHBOX_FEEDBACK_EXIT, up to
// maxAttempts times. The first success is committed.
func Reflexion(ctx context.Context, s Brancher, parent string, maxAttempts int, cmd Command, opts Options) (*Result, error) {
	const pattern = "reflexion"
	if maxAttempts < 1 {
		return nil, fmt.Errorf("%s: attempts must be at least 1, got %d: %w", pattern, maxAttempts, errdefs.ErrInvalidArgument)
	}
	if err := checkCommand(pattern, "the attempt", cmd); err != nil {
		return nil, err
	}
	e, cancel, err := newEngine(ctx, s, pattern, parent, opts)
	if err != nil {
		return nil, err
	}
	defer cancel()
	var prev *AttemptResult
	for k := 0; k < maxAttempts; k++ {
		if e.overallExpired() {
			e.markTimedOut()
			break
		}
		kids, err := e.fork(e.res.Parent, 1, 1, cmd.Args, true)
		if err != nil {
			if e.overallExpired() && e.ctx.Err() == nil {
				e.markTimedOut()
				break
			}
			return e.finish(), err
		}
		a := kids[0]
		env := []string{indexEnv(k)}
		if prev != nil {
			_, st, err := e.exec(a, Command{Args: writeFileArgs(FeedbackPath, []byte(prev.combined))}, nil, nil)
			if _, err = combinedOf(err); err != nil {
				e.stopped(a, err)
				break
			}
			if st.Code != 0 {
				e.failed(a, fmt.Sprintf("writing the feedback file exited with status %d", st.Code))
				return e.finish(), fmt.Errorf("%s: could not write %s in branch %s: %w", pattern, FeedbackPath, a.Branch, errdefs.ErrFailedPrecondition)
			}
			exit := strconv.Itoa(prev.ExitCode)
			if prev.Outcome == OutcomeTimeout {
				exit = "timeout"
			}
			env = append(env, EnvFeedback+"="+FeedbackPath, EnvFeedbackExit+"="+exit)
		}
		if e.runAttempt(a, cmd, env, nil) {
			if prev != nil {
				// The feedback is the pattern's, not the attempt's work.
				_, st, err := e.exec(a, Command{Args: []string{"rm", "-f", FeedbackPath}}, nil, nil)
				if _, err = combinedOf(err); err != nil {
					e.stopped(a, err)
					break
				}
				if st.Code != 0 {
					e.failed(a, "removing the feedback file failed")
					break
				}
			}
			if e.ctx.Err() != nil {
				e.stopped(a, e.ctx.Err())
				break
			}
			if err := e.commit(a.Branch); err != nil {
				a.Outcome, a.Error = OutcomeFailed, err.Error()
				return e.finish(), err
			}
			a.Outcome = OutcomeCommitted
			e.res.Winner, e.res.Committed = a.Index, a.Branch
			break
		}
		if a.Outcome == OutcomeAborted || e.overallExpired() {
			break
		}
		prev = a
	}
	res := e.finish()
	if err := ctx.Err(); err != nil && res.Winner < 0 {
		return res, err
	}
	return res, nil
}
