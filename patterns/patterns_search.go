//go:build linux

package patterns

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	"github.com/containerd/errdefs"
)

// SearchOptions shape a tree or beam search.
type SearchOptions struct {
	// Width is how many children an expanded node gets.
	Width int
	// Depth is the deepest level searched (1: children of the start).
	Depth int
	// Keep (beam search) is how many nodes are kept at each depth.
	Keep int
	// Budget (tree search) is how many nodes are expanded, the starting
	// branch included; default Depth.
	Budget int
	// Goal, if set, stops the search once a node scores at least this.
	Goal *float64
}

func (so SearchOptions) check(pattern string, beam bool) error {
	if so.Width < 1 || so.Depth < 1 {
		return fmt.Errorf("%s: width and depth must be at least 1, got %d and %d: %w", pattern, so.Width, so.Depth, errdefs.ErrInvalidArgument)
	}
	if beam && so.Keep < 1 {
		return fmt.Errorf("%s: keep must be at least 1, got %d: %w", pattern, so.Keep, errdefs.ErrInvalidArgument)
	}
	if !beam && so.Budget < 0 {
		return fmt.Errorf("%s: budget must not be negative, got %d: %w", pattern, so.Budget, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (so SearchOptions) reached(a *AttemptResult) bool {
	return so.Goal != nil && a != nil && a.Score != nil && *a.Score >= *so.Goal
}

// expand forks width children of each node of from (nil: the starting
// branch), in order, so that fork order (the tie-break) does not depend
// on timing; then runs step in every child concurrently and scores it.
// Every child's state starts from its parent's, so steps accumulate down
// a path.
func (e *engine) expand(from []*AttemptResult, depth, width int, step Command, score *Scorer) ([]*AttemptResult, error) {
	var level []*AttemptResult
	var envs [][]string
	for _, f := range from {
		parent := e.res.Parent
		var env []string
		if f != nil {
			parent = f.Branch
			f.expanded = true
			if f.Score != nil {
				env = append(env, EnvParentScore+"="+strconv.FormatFloat(*f.Score, 'g', -1, 64))
			}
		}
		kids, err := e.fork(parent, width, depth, step.Args, true)
		if f != nil {
			f.kids = append(f.kids, kids...)
		}
		if err != nil {
			return level, err
		}
		for i := range kids {
			envs = append(envs, append([]string{indexEnv(i), EnvDepth + "=" + strconv.Itoa(depth)}, env...))
		}
		level = append(level, kids...)
	}
	e.runAll(level, func(i int, a *AttemptResult) {
		e.runAttempt(a, step, envs[i], score)
	})
	return level, nil
}

// BeamSearch searches from parent level by level: each kept node (at
// first, parent itself) is forked into Width children, which run step and
// are scored; the best Keep children of the level (ties: the first
// forked) are kept and the others aborted, as is every node of the level
// above that kept none of its children. It stops at Depth, when no child
// of a level succeeds, at the Goal, or at the overall timeout; then the
// best kept node of the last level is committed into its parent, and so
// on up its ancestors into parent (nested commits), which invalidates
// everything else.
func BeamSearch(ctx context.Context, s Brancher, parent string, step Command, score Scorer, so SearchOptions, opts Options) (*Result, error) {
	const pattern = "beam"
	if err := checkSearch(pattern, step, score, so, true); err != nil {
		return nil, err
	}
	e, cancel, err := newEngine(ctx, s, pattern, parent, opts)
	if err != nil {
		return nil, err
	}
	defer cancel()
	frontier := []*AttemptResult{nil}
	for d := 1; d <= so.Depth && !e.overallExpired(); d++ {
		level, err := e.expand(frontier, d, so.Width, step, &score)
		if err != nil {
			return e.finish(), err
		}
		if err := e.ctx.Err(); err != nil {
			return e.finish(), err
		}
		var cands []*AttemptResult
		for _, a := range level {
			if a.Outcome == "" {
				cands = append(cands, a)
			}
		}
		if len(cands) == 0 {
			break
		}
		sortByScore(cands)
		keep := cands[:min(so.Keep, len(cands))]
		for _, a := range cands[len(keep):] {
			a.Outcome, a.Error = OutcomePruned, fmt.Sprintf("not among the best %d at depth %d", so.Keep, d)
			_ = e.abort(a.Branch)
		}
		for _, f := range frontier {
			if f != nil && !anyLive(f.kids) {
				f.Outcome, f.Error = OutcomePruned, fmt.Sprintf("none of its children kept at depth %d", d)
				_ = e.abort(f.Branch)
			}
		}
		reached := so.reached(keep[0])
		// The next level forks in fork order, not score order.
		sort.Slice(keep, func(i, j int) bool { return keep[i].Index < keep[j].Index })
		frontier = keep
		if reached {
			break
		}
	}
	if e.overallExpired() {
		e.markTimedOut()
	}
	var cands []*AttemptResult
	for _, f := range frontier {
		if f != nil && f.Outcome == "" {
			cands = append(cands, f)
		}
	}
	return e.finishSearch(ctx, best(cands))
}

// TreeSearch is best-first search from parent: parent is expanded into
// Width children, which run step and are scored; then, again and again,
// the best-scoring node not yet expanded (any depth below Depth; ties: the
// first forked) is expanded, until Budget expansions are made, nothing is
// left to expand, a node reaches the Goal, or the overall timeout expires.
// No node is pruned meanwhile, so the search backs up to an earlier node
// when a node's children score worse than it. The best-scoring node of
// the whole tree is committed (its own children aborted) up through its
// ancestors into parent.
func TreeSearch(ctx context.Context, s Brancher, parent string, step Command, score Scorer, so SearchOptions, opts Options) (*Result, error) {
	const pattern = "tree-search"
	if err := checkSearch(pattern, step, score, so, false); err != nil {
		return nil, err
	}
	if so.Budget == 0 {
		so.Budget = so.Depth
	}
	e, cancel, err := newEngine(ctx, s, pattern, parent, opts)
	if err != nil {
		return nil, err
	}
	defer cancel()
	var from *AttemptResult
	for n := 0; n < so.Budget && !e.overallExpired(); n++ {
		depth := 1
		if from != nil {
			depth = from.Depth + 1
		}
		if _, err := e.expand([]*AttemptResult{from}, depth, so.Width, step, &score); err != nil {
			return e.finish(), err
		}
		if err := e.ctx.Err(); err != nil {
			return e.finish(), err
		}
		live := e.liveScored()
		if so.reached(best(live)) {
			break
		}
		from = nil
		for _, a := range live {
			if !a.expanded && a.Depth < so.Depth && (from == nil || *a.Score > *from.Score) {
				from = a
			}
		}
		if from == nil {
			break
		}
	}
	if e.overallExpired() {
		e.markTimedOut()
	}
	return e.finishSearch(ctx, best(e.liveScored()))
}

func checkSearch(pattern string, step Command, score Scorer, so SearchOptions, beam bool) error {
	if err := checkCommand(pattern, "the step", step); err != nil {
		return err
	}
	if err := score.check(pattern); err != nil {
		return err
	}
	return so.check(pattern, beam)
}

// liveScored lists, in fork order, the attempts still in the running.
func (e *engine) liveScored() []*AttemptResult {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*AttemptResult
	for _, a := range e.attempts {
		if a.Outcome == "" && a.Score != nil {
			out = append(out, a)
		}
	}
	return out
}

func anyLive(as []*AttemptResult) bool {
	for _, a := range as {
		if a.Outcome == "" {
			return true
		}
	}
	return false
}

// sortByScore orders by score, highest first, then by fork order.
func sortByScore(as []*AttemptResult) {
	sort.SliceStable(as, func(i, j int) bool {
		if *as[i].Score != *as[j].Score {
			return *as[i].Score > *as[j].Score
		}
		return as[i].Index < as[j].Index
	})
}

// finishSearch commits w up through its ancestors (unless the caller's
// context ended) and cleans up.
func (e *engine) finishSearch(ctx context.Context, w *AttemptResult) (*Result, error) {
	if err := ctx.Err(); err != nil {
		return e.finish(), err
	}
	if w == nil {
		return e.finish(), nil
	}
	err := e.commitPath(w)
	return e.finish(), err
}

// commitPath commits w into its parent, then that into its parent, and so
// on into the starting branch: only a leaf may commit, and each commit
// leaves the next one a leaf, its other children invalidated.
func (e *engine) commitPath(w *AttemptResult) error {
	for _, k := range w.kids {
		if k.Outcome == "" {
			k.Outcome, k.Error = OutcomePruned, "its parent scored better and was chosen"
		}
		_ = e.abort(k.Branch)
	}
	var path []*AttemptResult
	for n := w; n != nil; n = e.byBranch[n.Parent] {
		path = append(path, n)
	}
	for _, n := range path {
		if err := e.commit(n.Branch); err != nil {
			n.Outcome, n.Error = OutcomeFailed, err.Error()
			return err
		}
		n.Outcome = OutcomeCommitted
	}
	top := path[len(path)-1]
	e.res.Winner, e.res.Committed = w.Index, top.Branch
	for i := len(path) - 1; i >= 0; i-- {
		e.res.Path = append(e.res.Path, path[i].Branch)
	}
	return nil
}
