//go:build linux

package patterns

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/client"
)

// forever stands for a command that would not end by itself: only a
// timeout, a commit or an abort ends it.
const forever = time.Hour

func sh(s string) Command { return Command{Args: []string{"sh", "-c", s}} }

func outcomes(r *Result) []Outcome {
	var out []Outcome
	for _, a := range r.Attempts {
		out = append(out, a.Outcome)
	}
	return out
}

func wantOutcomes(t *testing.T, r *Result, want ...Outcome) {
	t.Helper()
	got := outcomes(r)
	if len(got) != len(want) {
		t.Fatalf("outcomes %v, want %v (attempts %+v)", got, want, r.Attempts)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("outcomes %v, want %v (attempts %+v)", got, want, r.Attempts)
		}
	}
}

// must(t)(pattern(...)) fails the test if the pattern returned an error.
func must(t *testing.T) func(*Result, error) *Result {
	return func(r *Result, err error) *Result {
		t.Helper()
		if err != nil {
			t.Fatalf("%v (result %+v)", err, r)
		}
		return r
	}
}

func TestSpeculateFirstSuccessCommits(t *testing.T) {
	f := newFake(t, func(c *fakeCall) fakeReply {
		switch c.Args[2] {
		case "fail":
			return fakeReply{Code: 1, Out: "no luck\n"}
		case "quick":
			return fakeReply{Delay: 10 * time.Millisecond, Writes: map[string]string{"/win": "quick"}}
		}
		return fakeReply{Delay: forever, Writes: map[string]string{"/win": "slow"}}
	})
	r := must(t)(Speculate(context.Background(), f, "", []Command{sh("fail"), sh("quick"), sh("slow")}, Options{}))
	wantOutcomes(t, r, OutcomeFailed, OutcomeCommitted, OutcomeLost)
	if r.Winner != 1 || r.Committed != r.Attempts[1].Branch || r.Attempts[0].ExitCode != 1 || r.Attempts[0].Output != "no luck\n" {
		t.Fatalf("result %+v", r)
	}
	if got := f.rootFiles()["/win"]; got != "quick" {
		t.Fatalf("parent has /win %q, want the winner's", got)
	}
}

func TestSpeculateNoneSucceeds(t *testing.T) {
	f := newFake(t, func(c *fakeCall) fakeReply {
		return fakeReply{Code: 2, Writes: map[string]string{"/x": "y"}}
	})
	r := must(t)(Speculate(context.Background(), f, "", []Command{sh("a"), sh("b")}, Options{}))
	wantOutcomes(t, r, OutcomeFailed, OutcomeFailed)
	if r.Winner != -1 || r.Committed != "" || f.rootFiles()["/x"] != "" {
		t.Fatalf("result %+v, parent %v: want nothing committed", r, f.rootFiles())
	}
}

func TestSpeculateBranchTimeout(t *testing.T) {
	f := newFake(t, func(c *fakeCall) fakeReply {
		if c.Args[2] == "hang" {
			return fakeReply{Delay: forever}
		}
		return fakeReply{Code: 1}
	})
	r := must(t)(Speculate(context.Background(), f, "", []Command{sh("hang"), sh("fail")}, Options{BranchTimeout: 20 * time.Millisecond}))
	wantOutcomes(t, r, OutcomeTimeout, OutcomeFailed)
	if r.TimedOut || r.Attempts[0].ExitCode != -1 || !strings.Contains(r.Attempts[0].Error, "branch timeout") {
		t.Fatalf("result %+v: want a branch timeout, not the overall one", r)
	}
}

func TestSpeculateOverallTimeout(t *testing.T) {
	f := newFake(t, func(c *fakeCall) fakeReply { return fakeReply{Delay: forever} })
	r := must(t)(Speculate(context.Background(), f, "", []Command{sh("a"), sh("b"), sh("c")}, Options{Timeout: 20 * time.Millisecond}))
	wantOutcomes(t, r, OutcomeTimeout, OutcomeTimeout, OutcomeTimeout)
	if !r.TimedOut || r.Winner != -1 {
		t.Fatalf("result %+v", r)
	}
}

// TestSpeculateStartsFromParent: a pattern started from a branch forks
// under it and commits into it.
func TestSpeculateStartsFromParent(t *testing.T) {
	f := newFake(t, func(c *fakeCall) fakeReply {
		return fakeReply{Writes: map[string]string{"/deep": c.Files["/mid"]}}
	})
	ctx := context.Background()
	mid, _ := f.Fork(ctx, client.ForkOptions{Count: 1})
	f.nodes[mid[0].ID].files["/mid"] = "m"
	r := must(t)(Speculate(ctx, f, mid[0].ID, []Command{sh("x")}, Options{}))
	if r.Parent != mid[0].ID || r.Attempts[0].Parent != mid[0].ID {
		t.Fatalf("result %+v", r)
	}
	if got := f.nodes[mid[0].ID].files["/deep"]; got != "m" {
		t.Fatalf("middle branch has /deep %q", got)
	}
	if _, err := f.Abort(ctx, mid[0].ID); err != nil {
		t.Fatal(err)
	}
}

func scoreOf(c *fakeCall) fakeReply {
	return fakeReply{Out: c.Files["/score"] + "\n"}
}

func TestBestOfN(t *testing.T) {
	// Attempt i writes /out=i and /score; 3 fails; 1 and 2 tie.
	scores := []string{"3", "7", "7", "9"}
	f := newFake(t, func(c *fakeCall) fakeReply {
		if c.Args[0] == "score" {
			return scoreOf(c)
		}
		i, _ := strconv.Atoi(c.Env[EnvIndex])
		code := 0
		if i == 3 {
			code = 1
		}
		return fakeReply{Code: code, Writes: map[string]string{"/out": c.Env[EnvIndex], "/score": scores[i]}}
	})
	r := must(t)(BestOfN(context.Background(), f, "", 4, sh("work"), Scorer{Args: []string{"score"}}, Options{}))
	wantOutcomes(t, r, OutcomeLost, OutcomeCommitted, OutcomeLost, OutcomeFailed)
	if r.Winner != 1 || *r.Attempts[0].Score != 3 || *r.Attempts[1].Score != 7 || r.Attempts[3].Score != nil {
		t.Fatalf("result %+v", r)
	}
	if got := f.rootFiles()["/out"]; got != "1" {
		t.Fatalf("parent /out %q, want the first of the tied best", got)
	}
}

func TestBestOfNScoreFileAndStdout(t *testing.T) {
	scores := []string{"1", "not-a-number", "5", ""}
	f := newFake(t, func(c *fakeCall) fakeReply {
		i, _ := strconv.Atoi(c.Env[EnvIndex])
		w := map[string]string{"/out": c.Env[EnvIndex]}
		if scores[i] != "" {
			w["/score"] = scores[i]
		}
		return fakeReply{Writes: w, Out: "log line\n" + strconv.Itoa(10-i) + "\n"}
	})
	r := must(t)(BestOfN(context.Background(), f, "", 4, sh("work"), Scorer{File: "/score"}, Options{}))
	wantOutcomes(t, r, OutcomeLost, OutcomeFailed, OutcomeCommitted, OutcomeFailed)
	if !strings.Contains(r.Attempts[1].Error, "not a finite number") || !strings.Contains(r.Attempts[3].Error, "reading the score file /score exited with status 1") {
		t.Fatalf("unscorable attempts: %+v", r.Attempts)
	}
	if got := f.rootFiles()["/out"]; got != "2" {
		t.Fatalf("parent /out %q", got)
	}
	// Scored by the command's own stdout: the last line.
	r = must(t)(BestOfN(context.Background(), f, "", 3, sh("work"), Scorer{}, Options{}))
	if r.Winner != 0 || *r.Attempts[2].Score != 8 {
		t.Fatalf("result %+v", r)
	}
}

func TestBestOfNTimeouts(t *testing.T) {
	f := newFake(t, func(c *fakeCall) fakeReply {
		if c.Env[EnvIndex] == "1" {
			return fakeReply{Delay: forever}
		}
		return fakeReply{Out: c.Env[EnvIndex], Writes: map[string]string{"/out": c.Env[EnvIndex]}}
	})
	// The overall timeout aborts what runs and commits the best finished.
	r := must(t)(BestOfN(context.Background(), f, "", 3, sh("work"), Scorer{}, Options{Timeout: 30 * time.Millisecond}))
	wantOutcomes(t, r, OutcomeLost, OutcomeTimeout, OutcomeCommitted)
	if !r.TimedOut || f.rootFiles()["/out"] != "2" {
		t.Fatalf("result %+v", r)
	}
	r = must(t)(BestOfN(context.Background(), f, "", 2, sh("work"), Scorer{}, Options{BranchTimeout: 30 * time.Millisecond}))
	wantOutcomes(t, r, OutcomeCommitted, OutcomeTimeout)
	if r.TimedOut {
		t.Fatalf("result %+v", r)
	}
}

func TestBestOfNNoneScored(t *testing.T) {
	f := newFake(t, func(c *fakeCall) fakeReply { return fakeReply{Out: "done\n"} })
	r := must(t)(BestOfN(context.Background(), f, "", 2, sh("work"), Scorer{}, Options{}))
	wantOutcomes(t, r, OutcomeFailed, OutcomeFailed)
	if r.Winner != -1 {
		t.Fatalf("result %+v", r)
	}
}

// judgeByLength says "a" when candidate A is at least as long as B.
func judgeByLength(c *fakeCall) fakeReply {
	a, b := c.Files[c.Env[EnvJudgeA]], c.Files[c.Env[EnvJudgeB]]
	if len(a) >= len(b) {
		return fakeReply{Out: "thinking\na\n"}
	}
	return fakeReply{Out: "B\n"}
}

func TestTournament(t *testing.T) {
	lengths := []int{3, 9, 1, 9, 4}
	f := newFake(t, func(c *fakeCall) fakeReply {
		if c.Args[0] == "judge" {
			if c.Files["/out"] != "" {
				t.Errorf("the judge sees a candidate's state: %v", c.Files)
			}
			return judgeByLength(c)
		}
		i, _ := strconv.Atoi(c.Env[EnvIndex])
		return fakeReply{Out: strings.Repeat("x", lengths[i]), Writes: map[string]string{"/out": c.Env[EnvIndex]}}
	})
	r := must(t)(Tournament(context.Background(), f, "", 5, sh("work"), Judge{Args: []string{"judge"}}, Options{}))
	wantOutcomes(t, r, OutcomeLost, OutcomeCommitted, OutcomeLost, OutcomeLost, OutcomeLost)
	want := []Match{{Round: 1, A: 0, B: 1, Winner: 1}, {Round: 1, A: 2, B: 3, Winner: 3}, {Round: 2, A: 1, B: 3, Winner: 1}, {Round: 3, A: 1, B: 4, Winner: 1}}
	if len(r.Matches) != len(want) {
		t.Fatalf("matches %+v", r.Matches)
	}
	for i, m := range r.Matches {
		if m.Round != want[i].Round || m.A != want[i].A || m.B != want[i].B || m.Winner != want[i].Winner || m.Error != "" || m.Judge != r.Matches[0].Judge {
			t.Fatalf("match %d: %+v, want %+v (one judge branch for all)", i, m, want[i])
		}
	}
	if got := f.rootFiles(); got["/out"] != "1" || got[candidatePath(1)] != "" {
		t.Fatalf("parent files %v: want the winner's, and no candidate file", got)
	}
}

func TestTournamentCandidateFileAndBadJudge(t *testing.T) {
	f := newFake(t, func(c *fakeCall) fakeReply {
		switch c.Args[0] {
		case "judge":
			if c.Env[EnvJudgeAIndex] == "0" && c.Env[EnvJudgeBIndex] == "1" {
				return fakeReply{Out: "maybe\n"}
			}
			return judgeByLength(c)
		}
		i, _ := strconv.Atoi(c.Env[EnvIndex])
		if i == 3 {
			return fakeReply{Code: 1}
		}
		return fakeReply{Writes: map[string]string{"/cand": strings.Repeat("y", i+1), "/out": c.Env[EnvIndex]}}
	})
	r := must(t)(Tournament(context.Background(), f, "", 4, sh("work"), Judge{Args: []string{"judge"}, File: "/cand"}, Options{}))
	// 3 fails; round 1: 0 vs 1 gets no verdict (0 goes on), 2 has a bye;
	// round 2: 0 vs 2, judged by length: 2.
	wantOutcomes(t, r, OutcomeLost, OutcomeLost, OutcomeCommitted, OutcomeFailed)
	if len(r.Matches) != 2 || !strings.Contains(r.Matches[0].Error, `said "maybe"`) || r.Matches[0].Winner != 0 || r.Matches[1].Winner != 2 {
		t.Fatalf("matches %+v", r.Matches)
	}
}

func TestTournamentJudgeTimeout(t *testing.T) {
	var mu sync.Mutex
	judged := 0
	f := newFake(t, func(c *fakeCall) fakeReply {
		if c.Args[0] == "judge" {
			mu.Lock()
			defer mu.Unlock()
			judged++
			if judged == 1 {
				return fakeReply{Delay: forever}
			}
			return fakeReply{Out: "b"}
		}
		return fakeReply{Out: c.Env[EnvIndex], Writes: map[string]string{"/out": c.Env[EnvIndex]}}
	})
	r := must(t)(Tournament(context.Background(), f, "", 3, sh("work"), Judge{Args: []string{"judge"}}, Options{BranchTimeout: 50 * time.Millisecond}))
	if len(r.Matches) != 2 || !strings.Contains(r.Matches[0].Error, "timed out") || r.Matches[0].Winner != 0 || r.Matches[1].Winner != 2 || r.Matches[0].Judge == r.Matches[1].Judge {
		t.Fatalf("matches %+v: want a timed-out judge replaced by a new branch", r.Matches)
	}
	if r.Winner != 2 || f.rootFiles()["/out"] != "2" {
		t.Fatalf("result %+v", r)
	}
}

func TestTournamentOverallTimeoutWhileJudging(t *testing.T) {
	f := newFake(t, func(c *fakeCall) fakeReply {
		if c.Args[0] == "judge" {
			return fakeReply{Delay: forever}
		}
		return fakeReply{Out: "x"}
	})
	r := must(t)(Tournament(context.Background(), f, "", 2, sh("work"), Judge{Args: []string{"judge"}}, Options{Timeout: 50 * time.Millisecond}))
	wantOutcomes(t, r, OutcomeTimeout, OutcomeTimeout)
	if !r.TimedOut || r.Winner != -1 {
		t.Fatalf("result %+v", r)
	}
}

func TestReflexion(t *testing.T) {
	f := newFake(t, func(c *fakeCall) fakeReply {
		fb := c.Files[c.Env[EnvFeedback]]
		switch {
		case c.Env[EnvIndex] == "0" && c.Env[EnvFeedback] == "":
			return fakeReply{Out: "hint-1\n", Code: 1}
		case strings.Contains(fb, "hint-1") && c.Env[EnvFeedbackExit] == "1":
			return fakeReply{Out: "hint-2\n", Code: 2}
		case strings.Contains(fb, "hint-2") && c.Env[EnvFeedbackExit] == "2":
			return fakeReply{Writes: map[string]string{"/fixed": "yes"}}
		}
		t.Errorf("unexpected call %+v", c)
		return fakeReply{Code: 99}
	})
	r := must(t)(Reflexion(context.Background(), f, "", 5, sh("try"), Options{}))
	wantOutcomes(t, r, OutcomeFailed, OutcomeFailed, OutcomeCommitted)
	files := f.rootFiles()
	if files["/fixed"] != "yes" {
		t.Fatalf("parent files %v", files)
	}
	if _, ok := files[FeedbackPath]; ok {
		t.Fatalf("the feedback file was committed: %v", files)
	}
}

func TestReflexionGivesUp(t *testing.T) {
	f := newFake(t, func(c *fakeCall) fakeReply {
		if c.Env[EnvIndex] == "0" {
			return fakeReply{Delay: forever, Out: "partial\n"}
		}
		if c.Env[EnvFeedbackExit] != "timeout" || c.Files[FeedbackPath] != "partial\n" {
			t.Errorf("attempt %s: feedback exit %q, file %q", c.Env[EnvIndex], c.Env[EnvFeedbackExit], c.Files[FeedbackPath])
		}
		return fakeReply{Code: 1}
	})
	r, err := Reflexion(context.Background(), f, "", 2, sh("try"), Options{BranchTimeout: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wantOutcomes(t, r, OutcomeTimeout, OutcomeFailed)
	if r.Winner != -1 {
		t.Fatalf("result %+v", r)
	}
}

// pathScores gives each search node (named by the indexes down its path)
// a score.
func searchFake(t *testing.T, scores map[string]float64, fail map[string]bool) *fakeBox {
	return newFake(t, func(c *fakeCall) fakeReply {
		if c.Args[0] == "score" {
			return scoreOf(c)
		}
		p := c.Files["/path"] + c.Env[EnvIndex]
		if want := strconv.Itoa(len(p)); c.Env[EnvDepth] != want {
			t.Errorf("node %s: depth %s, want %s", p, c.Env[EnvDepth], want)
		}
		if fail[p] {
			return fakeReply{Code: 1}
		}
		s, ok := scores[p]
		if !ok {
			t.Errorf("node %s has no score", p)
		}
		return fakeReply{Writes: map[string]string{"/path": p, "/score": strconv.FormatFloat(s, 'g', -1, 64)}}
	})
}

func TestBeamSearch(t *testing.T) {
	// Width 3, keep 2, depth 2: level 1 keeps 1 and 2; level 2 keeps
	// 21 and 10; 21 wins.
	scores := map[string]float64{
		"0": 1, "1": 5, "2": 4,
		"10": 6, "11": 2, "12": 3,
		"20": 1, "21": 9, "22": 6,
	}
	f := searchFake(t, scores, nil)
	r := must(t)(BeamSearch(context.Background(), f, "", Command{Args: []string{"step"}}, Scorer{Args: []string{"score"}}, SearchOptions{Width: 3, Depth: 2, Keep: 2}, Options{}))
	if got := f.rootFiles()["/path"]; got != "21" {
		t.Fatalf("parent /path %q, want 21 (result %+v)", got, r)
	}
	if len(r.Path) != 2 || r.Committed != r.Path[0] || r.Attempts[r.Winner].Branch != r.Path[1] {
		t.Fatalf("path %v committed %s winner %d", r.Path, r.Committed, r.Winner)
	}
	count := map[Outcome]int{}
	for _, a := range r.Attempts {
		count[a.Outcome]++
	}
	// Level 1: 0 pruned; level 2: 11, 12, 20 pruned (22 ties with 10
	// and loses on fork order), 10 lost to 21's commit, 1 invalidated.
	if count[OutcomeCommitted] != 2 || count[OutcomePruned] != 5 || count[OutcomeLost] != 2 || len(r.Attempts) != 9 {
		t.Fatalf("outcomes %v: %+v", count, r.Attempts)
	}
}

func TestBeamSearchStopsAtAFailedLevelAndGoal(t *testing.T) {
	scores := map[string]float64{"0": 1, "1": 2}
	f := searchFake(t, scores, map[string]bool{"00": true, "01": true, "10": true, "11": true})
	r := must(t)(BeamSearch(context.Background(), f, "", Command{Args: []string{"step"}}, Scorer{Args: []string{"score"}}, SearchOptions{Width: 2, Depth: 3, Keep: 2}, Options{}))
	if got := f.rootFiles()["/path"]; got != "1" || len(r.Attempts) != 6 {
		t.Fatalf("parent /path %q (attempts %d), want the best of level 1", got, len(r.Attempts))
	}
	goal := 2.0
	scores = map[string]float64{"0": 1, "1": 2, "10": 3, "11": 3}
	f = searchFake(t, scores, nil)
	r = must(t)(BeamSearch(context.Background(), f, "", Command{Args: []string{"step"}}, Scorer{Args: []string{"score"}}, SearchOptions{Width: 2, Depth: 3, Keep: 1, Goal: &goal}, Options{}))
	if got := f.rootFiles()["/path"]; got != "1" || len(r.Attempts) != 2 {
		t.Fatalf("parent /path %q (attempts %d), want a stop at the goal", got, len(r.Attempts))
	}
}

func TestTreeSearchBacksUp(t *testing.T) {
	// 0 scores best and is expanded first, but its children are worse;
	// the search backs up to 1, whose child 10 is the best of the tree.
	scores := map[string]float64{
		"0": 5, "1": 4,
		"00": 1, "01": 2,
		"10": 6, "11": 3,
	}
	f := searchFake(t, scores, nil)
	r := must(t)(TreeSearch(context.Background(), f, "", Command{Args: []string{"step"}}, Scorer{Args: []string{"score"}}, SearchOptions{Width: 2, Depth: 3, Budget: 3}, Options{}))
	if got := f.rootFiles()["/path"]; got != "10" {
		t.Fatalf("parent /path %q, want 10 (result %+v)", got, r)
	}
	if len(r.Attempts) != 6 || len(r.Path) != 2 {
		t.Fatalf("result %+v", r)
	}
	// A node better than its children is committed with its children
	// aborted.
	scores = map[string]float64{"0": 5, "1": 4, "00": 1, "01": 2}
	f = searchFake(t, scores, nil)
	r = must(t)(TreeSearch(context.Background(), f, "", Command{Args: []string{"step"}}, Scorer{Args: []string{"score"}}, SearchOptions{Width: 2, Depth: 3, Budget: 2}, Options{}))
	if got := f.rootFiles()["/path"]; got != "0" || r.Attempts[2].Outcome != OutcomePruned {
		t.Fatalf("parent /path %q, want 0 (result %+v)", got, r)
	}
}

func TestSearchOverallTimeoutCommitsBestSoFar(t *testing.T) {
	f := newFake(t, func(c *fakeCall) fakeReply {
		if c.Env[EnvDepth] == "2" {
			return fakeReply{Delay: forever}
		}
		return fakeReply{Out: c.Env[EnvIndex], Writes: map[string]string{"/path": c.Env[EnvIndex]}}
	})
	for _, search := range []func(context.Context, Brancher, string, Command, Scorer, SearchOptions, Options) (*Result, error){BeamSearch, TreeSearch} {
		r := must(t)(search(context.Background(), f, "", Command{Args: []string{"step"}}, Scorer{}, SearchOptions{Width: 2, Depth: 2, Keep: 1, Budget: 2}, Options{Timeout: 50 * time.Millisecond}))
		if !r.TimedOut || r.Winner != 1 || f.rootFiles()["/path"] != "1" {
			t.Fatalf("%s: result %+v", r.Pattern, r)
		}
		if a := r.Attempts[2]; a.Outcome != OutcomeTimeout {
			t.Fatalf("%s: a node running at the timeout: %+v", r.Pattern, a)
		}
	}
}

// TestPatternsCancel: when the caller's context ends, every pattern aborts
// what it made, commits nothing and returns the context's error.
func TestPatternsCancel(t *testing.T) {
	for name, run := range map[string]func(context.Context, Brancher) (*Result, error){
		"speculate": func(ctx context.Context, s Brancher) (*Result, error) {
			return Speculate(ctx, s, "", []Command{sh("a"), sh("b")}, Options{})
		},
		"best-of-n": func(ctx context.Context, s Brancher) (*Result, error) {
			return BestOfN(ctx, s, "", 3, sh("a"), Scorer{}, Options{})
		},
		"tournament": func(ctx context.Context, s Brancher) (*Result, error) {
			return Tournament(ctx, s, "", 3, sh("a"), Judge{Args: []string{"judge"}}, Options{})
		},
		"reflexion": func(ctx context.Context, s Brancher) (*Result, error) {
			return Reflexion(ctx, s, "", 3, sh("a"), Options{})
		},
		"beam": func(ctx context.Context, s Brancher) (*Result, error) {
			return BeamSearch(ctx, s, "", sh("a"), Scorer{}, SearchOptions{Width: 2, Depth: 2, Keep: 1}, Options{})
		},
		"tree-search": func(ctx context.Context, s Brancher) (*Result, error) {
			return TreeSearch(ctx, s, "", sh("a"), Scorer{}, SearchOptions{Width: 2, Depth: 2}, Options{})
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var once sync.Once
			f := newFake(t, func(c *fakeCall) fakeReply {
				once.Do(cancel)
				return fakeReply{Delay: forever}
			})
			r, err := run(ctx, f)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err %v, want canceled", err)
			}
			for _, a := range r.Attempts {
				if a.Outcome != OutcomeAborted {
					t.Fatalf("attempt %+v, want aborted", a)
				}
			}
			if r.Winner != -1 || len(f.rootFiles()) != 1 {
				t.Fatalf("result %+v", r)
			}
		})
	}
}

func TestPatternsBadInput(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, func(c *fakeCall) fakeReply { return fakeReply{} })
	ok := sh("true")
	for name, err := range map[string]error{
		"no attempts":      second(Speculate(ctx, f, "", nil, Options{})),
		"empty attempt":    second(Speculate(ctx, f, "", []Command{{}}, Options{})),
		"negative timeout": second(Speculate(ctx, f, "", []Command{ok}, Options{Timeout: -1})),
		"n 0":              second(BestOfN(ctx, f, "", 0, ok, Scorer{}, Options{})),
		"two scorers":      second(BestOfN(ctx, f, "", 1, ok, Scorer{Args: []string{"x"}, File: "/f"}, Options{})),
		"no judge":         second(Tournament(ctx, f, "", 2, ok, Judge{}, Options{})),
		"0 attempts":       second(Reflexion(ctx, f, "", 0, ok, Options{})),
		"no keep":          second(BeamSearch(ctx, f, "", ok, Scorer{}, SearchOptions{Width: 1, Depth: 1}, Options{})),
		"no width":         second(TreeSearch(ctx, f, "", ok, Scorer{}, SearchOptions{Depth: 1}, Options{})),
		"no step":          second(TreeSearch(ctx, f, "", Command{}, Scorer{}, SearchOptions{Width: 1, Depth: 1}, Options{})),
	} {
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
	if f.next != 1 {
		t.Fatalf("bad input forked branches")
	}
}

func second(_ *Result, err error) error { return err }

func TestParseScore(t *testing.T) {
	for in, want := range map[string]float64{"3": 3, " -2.5 \n": -2.5, "log\nmore\n1e3\n\n": 1000} {
		if got, err := parseScore(in); err != nil || got != want {
			t.Errorf("parseScore(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "\n", "NaN", "Inf", "7 points"} {
		if _, err := parseScore(in); err == nil {
			t.Errorf("parseScore(%q): no error", in)
		}
	}
}

func TestTailBuffer(t *testing.T) {
	b := &tailBuffer{max: 4}
	_, _ = b.Write([]byte("abc"))
	_, _ = b.Write([]byte("defg"))
	if b.String() != "defg" {
		t.Fatalf("tail %q", b.String())
	}
	if got := tail("héllo", 4); got != "llo" {
		t.Fatalf("tail cut inside a rune: %q", got)
	}
}
