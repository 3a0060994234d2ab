//go:build linux

package patterns

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
)

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
