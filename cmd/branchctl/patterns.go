//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/patterns"
)

const patternsUsage = `Exploration patterns (REF is SANDBOX[/BRANCH]: each forks it, commits one
branch into it and aborts every other; exit 0 if something was committed,
1 if not, 2 for bad usage):

  speculate REF [-c SH]... [-n N -- CMD...]
                                  run each -c (sh -c SH), and N copies of
                                  CMD, concurrently: the first to exit 0 wins
  best-of-n REF -n N [--score SH | --score-file PATH] -- CMD...
                                  run CMD N times, score each (last line of
                                  SH's stdout, of PATH, or of CMD's stdout),
                                  commit the highest (ties: lowest index)
  tournament REF -n N --judge SH [--candidate-file PATH] -- CMD...
                                  run CMD N times, judge pairs (SH prints a
                                  or b; candidates in files $BRANCHBOX_A and
                                  $BRANCHBOX_B), commit the last standing
  reflexion REF [--attempts K] -- CMD...
                                  retry CMD in a fresh branch until it exits
                                  0, with the last attempt's output in the
                                  file $BRANCHBOX_FEEDBACK
  beam REF --width W --depth D --keep K [--goal G] [--score SH | --score-file PATH] -- STEP...
                                  beam search: expand kept nodes into W
                                  children running STEP, keep the best K
                                  per depth, commit the best leaf's path
  tree-search REF --width W --depth D [--budget B] [--goal G] [--score SH | --score-file PATH] -- STEP...
                                  best-first search: expand the best node
                                  so far, B times; commit the best node's path

  Each also takes --timeout D (overall) and --branch-timeout D (per branch;
  a branch over it is aborted and reported as timeout), --env K=V, --seal,
  --net, --memory, --cpus, --pids (as fork), and --json. Commands see
  BRANCH_INDEX (and BRANCHBOX_DEPTH in searches).
`

// patternCmd is what every pattern command parses.
type patternCmd struct {
	g         globals
	opts      patterns.Options
	memory    string
	env       multi
	sandbox   string
	parent    string
	cmd       []string
	scoreCmd  string
	scoreFile string
	goal      string
}

func (p *patternCmd) flags(name string, g globals) *flag.FlagSet {
	p.g = g
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&p.g.address, "address", g.address, "containerd's socket")
	fs.StringVar(&p.g.namespace, "namespace", g.namespace, "containerd namespace")
	fs.BoolVar(&p.g.json, "json", g.json, "print the result as JSON")
	fs.DurationVar(&p.opts.Timeout, "timeout", 0, "overall timeout (e.g. 30s): then every branch still running is aborted; 0: none")
	fs.DurationVar(&p.opts.BranchTimeout, "branch-timeout", 0, "timeout of each branch's work, from its fork; 0: none")
	fs.Var(&p.env, "env", "add an environment variable (K=V) to every command, repeatable")
	fs.StringVar(&p.opts.Fork.Seal, "seal", "ro", "how the parent is sealed while it has branches: ro or freeze")
	fs.StringVar(&p.opts.Fork.Net, "net", "shared", "branch network: shared or isolated")
	fs.StringVar(&p.memory, "memory", "", "memory limit per branch (bytes, or with k, m, g)")
	fs.Float64Var(&p.opts.Fork.CPUs, "cpus", 0, "CPU limit per branch")
	fs.Int64Var(&p.opts.Fork.Pids, "pids", 0, "process limit per branch")
	return fs
}

func (p *patternCmd) scoreFlags(fs *flag.FlagSet) {
	fs.StringVar(&p.scoreCmd, "score", "", "score each branch by this shell command run in it (last line of its stdout)")
	fs.StringVar(&p.scoreFile, "score-file", "", "score each branch by the last line of this file it wrote")
}

func (p *patternCmd) scorer() patterns.Scorer {
	s := patterns.Scorer{File: p.scoreFile}
	if p.scoreCmd != "" {
		s.Args = shell(p.scoreCmd)
	}
	return s
}

func shell(s string) []string { return []string{"sh", "-c", s} }

func usageErr(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// parse reads the flags, the one REF and the command after "--"; errors
// here are usage errors.
func (p *patternCmd) parse(fs *flag.FlagSet, args []string, needCmd bool) error {
	pos, cmd, err := parse(fs, args)
	if err != nil {
		return err
	}
	ref, err := oneArg(pos, "SANDBOX or SANDBOX/BRANCH to explore from")
	if err != nil {
		return err
	}
	if p.sandbox, p.parent, err = splitRef(ref, false); err != nil {
		return err
	}
	if needCmd && len(cmd) == 0 {
		return usageErr("no command: write `branchctl %s %s [flags] -- CMD...`", fs.Name(), ref)
	}
	p.cmd = cmd
	if p.opts.Fork.Memory, err = parseBytes(p.memory); err != nil {
		return err
	}
	if p.opts.Timeout < 0 || p.opts.BranchTimeout < 0 {
		return usageErr("--timeout and --branch-timeout must not be negative")
	}
	if p.scoreCmd != "" && p.scoreFile != "" {
		return usageErr("--score and --score-file: give one")
	}
	p.opts.Env = p.env
	return nil
}

func (p *patternCmd) goalValue() (*float64, error) {
	if p.goal == "" {
		return nil, nil
	}
	v, err := strconv.ParseFloat(p.goal, 64)
	if err != nil {
		return nil, usageErr("--goal %q: want a number", p.goal)
	}
	return &v, nil
}

// runPattern dials the sandbox and runs the pattern until it returns or
// the command is interrupted (then the pattern aborts what it made), and
// prints its result.
func (p *patternCmd) run(ctx context.Context, stdout io.Writer, f func(context.Context, patterns.Brancher, string) (*patterns.Result, error)) (int, error) {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, unix.SIGTERM)
	defer stop()
	c, err := dial(ctx, p.g, p.sandbox)
	if err != nil {
		return 1, err
	}
	defer c.Close()
	res, err := f(ctx, c, p.parent)
	if res != nil {
		var perr error
		if p.g.json {
			perr = printJSON(stdout, res)
		} else {
			perr = PrintResult(stdout, p.sandbox, res)
		}
		if err == nil {
			err = perr
		}
	}
	if err != nil {
		return 1, err
	}
	if res.Winner < 0 {
		return 1, nil
	}
	return 0, nil
}

func cmdSpeculate(ctx context.Context, g globals, args []string, stdout io.Writer) (int, error) {
	var p patternCmd
	var cmds multi
	n := 1
	fs := p.flags("speculate", g)
	fs.Var(&cmds, "c", "an attempt: a shell command (sh -c), repeatable")
	fs.IntVar(&n, "n", 1, "copies of the command after --")
	if err := p.parse(fs, args, false); err != nil {
		return 2, err
	}
	var attempts []patterns.Command
	for _, c := range cmds {
		attempts = append(attempts, patterns.Command{Args: shell(c)})
	}
	if len(p.cmd) > 0 {
		if n < 1 {
			return 2, usageErr("-n %d: want at least 1", n)
		}
		for range n {
			attempts = append(attempts, patterns.Command{Args: p.cmd})
		}
	}
	if len(attempts) == 0 {
		return 2, usageErr("no attempts: give -c SH (repeatable) or -- CMD...")
	}
	return p.run(ctx, stdout, func(ctx context.Context, s patterns.Brancher, parent string) (*patterns.Result, error) {
		return patterns.Speculate(ctx, s, parent, attempts, p.opts)
	})
}

func cmdBestOfN(ctx context.Context, g globals, args []string, stdout io.Writer) (int, error) {
	var p patternCmd
	var n int
	fs := p.flags("best-of-n", g)
	fs.IntVar(&n, "n", 0, "number of branches")
	p.scoreFlags(fs)
	if err := p.parse(fs, args, true); err != nil {
		return 2, err
	}
	if n < 1 {
		return 2, usageErr("-n %d: want the number of branches, at least 1", n)
	}
	return p.run(ctx, stdout, func(ctx context.Context, s patterns.Brancher, parent string) (*patterns.Result, error) {
		return patterns.BestOfN(ctx, s, parent, n, patterns.Command{Args: p.cmd}, p.scorer(), p.opts)
	})
}

func cmdTournament(ctx context.Context, g globals, args []string, stdout io.Writer) (int, error) {
	var p patternCmd
	var n int
	var judge, file string
	fs := p.flags("tournament", g)
	fs.IntVar(&n, "n", 0, "number of branches")
	fs.StringVar(&judge, "judge", "", "shell command judging two candidates ($BRANCHBOX_A, $BRANCHBOX_B): prints a or b")
	fs.StringVar(&file, "candidate-file", "", "a branch's candidate is this file it wrote (default: its stdout)")
	if err := p.parse(fs, args, true); err != nil {
		return 2, err
	}
	if n < 1 {
		return 2, usageErr("-n %d: want the number of branches, at least 1", n)
	}
	if judge == "" {
		return 2, usageErr("no --judge: give a shell command that prints a or b")
	}
	return p.run(ctx, stdout, func(ctx context.Context, s patterns.Brancher, parent string) (*patterns.Result, error) {
		return patterns.Tournament(ctx, s, parent, n, patterns.Command{Args: p.cmd}, patterns.Judge{Args: shell(judge), File: file}, p.opts)
	})
}

func cmdReflexion(ctx context.Context, g globals, args []string, stdout io.Writer) (int, error) {
	var p patternCmd
	var k int
	fs := p.flags("reflexion", g)
	fs.IntVar(&k, "attempts", 3, "at most this many attempts")
	if err := p.parse(fs, args, true); err != nil {
		return 2, err
	}
	if k < 1 {
		return 2, usageErr("--attempts %d: want at least 1", k)
	}
	return p.run(ctx, stdout, func(ctx context.Context, s patterns.Brancher, parent string) (*patterns.Result, error) {
		return patterns.Reflexion(ctx, s, parent, k, patterns.Command{Args: p.cmd}, p.opts)
	})
}

func cmdSearch(ctx context.Context, g globals, name string, args []string, stdout io.Writer) (int, error) {
	var p patternCmd
	var so patterns.SearchOptions
	beam := name == "beam"
	fs := p.flags(name, g)
	fs.IntVar(&so.Width, "width", 2, "children per expanded node")
	fs.IntVar(&so.Depth, "depth", 2, "deepest level")
	if beam {
		fs.IntVar(&so.Keep, "keep", 2, "nodes kept per depth")
	} else {
		fs.IntVar(&so.Budget, "budget", 0, "expansions, the start included (default: --depth)")
	}
	fs.StringVar(&p.goal, "goal", "", "stop once a node scores at least this")
	p.scoreFlags(fs)
	if err := p.parse(fs, args, true); err != nil {
		return 2, err
	}
	goal, err := p.goalValue()
	if err != nil {
		return 2, err
	}
	so.Goal = goal
	if so.Width < 1 || so.Depth < 1 || (beam && so.Keep < 1) || so.Budget < 0 {
		return 2, usageErr("--width, --depth and --keep must be at least 1, --budget not negative")
	}
	search := patterns.TreeSearch
	if beam {
		search = patterns.BeamSearch
	}
	return p.run(ctx, stdout, func(ctx context.Context, s patterns.Brancher, parent string) (*patterns.Result, error) {
		return search(ctx, s, parent, patterns.Command{Args: p.cmd}, p.scorer(), so, p.opts)
	})
}

// PrintResult prints what a pattern did: one row per attempt, the matches
// of a tournament, and what was committed.
func PrintResult(w io.Writer, sandbox string, r *patterns.Result) error {
	search := r.Pattern == "beam" || r.Pattern == "tree-search"
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "ATTEMPT\tBRANCH\t"
	if search {
		head += "PARENT\tDEPTH\t"
	}
	head += "EXIT\tSCORE\tTIME\tOUTCOME\tNOTE"
	if r.Pattern == "speculate" {
		head += "\tCOMMAND"
	}
	fmt.Fprintln(tw, head)
	for _, a := range r.Attempts {
		row := fmt.Sprintf("%d\t%s/%s\t", a.Index, sandbox, a.Branch)
		if search {
			row += fmt.Sprintf("%s\t%d\t", a.Parent, a.Depth)
		}
		exit, score := "-", "-"
		if a.ExitCode >= 0 {
			exit = strconv.Itoa(a.ExitCode)
		}
		if a.Score != nil {
			score = strconv.FormatFloat(*a.Score, 'g', -1, 64)
		}
		row += fmt.Sprintf("%s\t%s\t%s\t%s\t%s", exit, score, a.Duration.Round(time.Millisecond), a.Outcome, clip(a.Error, 60))
		if r.Pattern == "speculate" {
			row += "\t" + clip(strings.Join(a.Args, " "), 40)
		}
		fmt.Fprintln(tw, row)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Matches) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ROUND\tA\tB\tWINNER\tJUDGE\tTIME\tNOTE")
		for _, m := range r.Matches {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s/%s\t%s\t%s\n", m.Round, m.A, m.B, m.Winner, sandbox, m.Judge, m.Duration.Round(time.Millisecond), clip(m.Error, 60))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	into := nodeName(r.Parent)
	switch {
	case r.Winner >= 0 && len(r.Path) > 1:
		fmt.Fprintf(w, "committed attempt %d into %s through %s (%s)\n", r.Winner, into, sandbox+"/"+strings.Join(r.Path, " -> "), r.Duration.Round(time.Millisecond))
	case r.Winner >= 0:
		fmt.Fprintf(w, "committed attempt %d (%s/%s) into %s (%s)\n", r.Winner, sandbox, r.Committed, into, r.Duration.Round(time.Millisecond))
	case r.TimedOut:
		fmt.Fprintf(w, "nothing committed: the overall timeout expired (%s)\n", r.Duration.Round(time.Millisecond))
	default:
		fmt.Fprintf(w, "nothing committed: no attempt succeeded (%s)\n", r.Duration.Round(time.Millisecond))
	}
	return nil
}

func clip(s string, n int) string {
	r := []rune(strings.ReplaceAll(s, "\n", " "))
	if len(r) <= n {
		return string(r)
	}
	return string(r[:n-3]) + "..."
}
