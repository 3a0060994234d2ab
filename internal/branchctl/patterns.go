//go:build linux

package branchctl

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/patterns"
)

// patternCmd is what every pattern command parses.
type patternCmd struct {
	g         globals
	opts      patterns.Options
	sandbox   string
	parent    string
	cmd       []string
	scoreCmd  string
	scoreFile string
	goal      string
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

// parse reads patternFlags (and scoreFlags, --goal where the command
// has them), the one REF and the command after "--"; errors here are
// usage errors.
func (p *patternCmd) parse(c *cli.Context, g globals, needCmd bool) error {
	p.g = g
	p.opts.Timeout, p.opts.BranchTimeout = c.Duration("timeout"), c.Duration("branch-timeout")
	p.opts.Env = c.StringSlice("env")
	p.opts.Fork.Seal, p.opts.Fork.Net = c.String("seal"), c.String("net")
	p.opts.Fork.CPUs, p.opts.Fork.Pids = c.Float64("cpus"), c.Int64("pids")
	p.scoreCmd, p.scoreFile, p.goal = c.String("score"), c.String("score-file"), c.String("goal")
	pos, cmd := split(c)
	ref, err := oneArg(pos, "SANDBOX or SANDBOX/BRANCH to explore from")
	if err != nil {
		return err
	}
	if p.sandbox, p.parent, err = splitRef(ref, false); err != nil {
		return err
	}
	if needCmd && len(cmd) == 0 {
		return usageErr("no command: write `branchctl %s %s [flags] -- CMD...`", c.Command.Name, ref)
	}
	p.cmd = cmd
	if p.opts.Fork.Memory, err = parseBytes(c.String("memory-limit")); err != nil {
		return err
	}
	if p.opts.Timeout < 0 || p.opts.BranchTimeout < 0 {
		return usageErr("--timeout and --branch-timeout must not be negative")
	}
	if p.scoreCmd != "" && p.scoreFile != "" {
		return usageErr("--score and --score-file: give one")
	}
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

// run dials the sandbox and runs the pattern until it returns or the
// command is interrupted (then the pattern aborts what it made), prints
// its result and sets the exit status: 0 if something was committed.
func (p *patternCmd) run(ctx context.Context, inv *invocation, f func(context.Context, patterns.Brancher, string) (*patterns.Result, error)) error {
	code, err := p.runPattern(ctx, inv.stdout, f)
	return ran(inv, code, err)
}

func (p *patternCmd) runPattern(ctx context.Context, stdout io.Writer, f func(context.Context, patterns.Brancher, string) (*patterns.Result, error)) (int, error) {
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
			perr = PrintJSON(stdout, res)
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

// usageCode sets a pattern's exit status for an error before it ran.
func usageCode(inv *invocation, err error) error {
	if err != nil {
		inv.code = 2
	}
	return err
}

func cmdSpeculate(c *cli.Context, g globals, inv *invocation) error {
	var p patternCmd
	cmds, n := c.StringSlice("c"), c.Int("n")
	if err := p.parse(c, g, false); err != nil {
		return usageCode(inv, err)
	}
	var attempts []patterns.Command
	for _, c := range cmds {
		attempts = append(attempts, patterns.Command{Args: shell(c)})
	}
	if len(p.cmd) > 0 {
		if n < 1 {
			return usageCode(inv, usageErr("-n %d: want at least 1", n))
		}
		for range n {
			attempts = append(attempts, patterns.Command{Args: p.cmd})
		}
	}
	if len(attempts) == 0 {
		return usageCode(inv, usageErr("no attempts: give -c SH (repeatable) or -- CMD..."))
	}
	return p.run(c.Context, inv, func(ctx context.Context, s patterns.Brancher, parent string) (*patterns.Result, error) {
		return patterns.Speculate(ctx, s, parent, attempts, p.opts)
	})
}

func cmdBestOfN(c *cli.Context, g globals, inv *invocation) error {
	var p patternCmd
	n := c.Int("n")
	if err := p.parse(c, g, true); err != nil {
		return usageCode(inv, err)
	}
	if n < 1 {
		return usageCode(inv, usageErr("-n %d: want the number of branches, at least 1", n))
	}
	return p.run(c.Context, inv, func(ctx context.Context, s patterns.Brancher, parent string) (*patterns.Result, error) {
		return patterns.BestOfN(ctx, s, parent, n, patterns.Command{Args: p.cmd}, p.scorer(), p.opts)
	})
}

func cmdTournament(c *cli.Context, g globals, inv *invocation) error {
	var p patternCmd
	n, judge, file := c.Int("n"), c.String("judge"), c.String("candidate-file")
	if err := p.parse(c, g, true); err != nil {
		return usageCode(inv, err)
	}
	if n < 1 {
		return usageCode(inv, usageErr("-n %d: want the number of branches, at least 1", n))
	}
	if judge == "" {
		return usageCode(inv, usageErr("no --judge: give a shell command that prints a or b"))
	}
	return p.run(c.Context, inv, func(ctx context.Context, s patterns.Brancher, parent string) (*patterns.Result, error) {
		return patterns.Tournament(ctx, s, parent, n, patterns.Command{Args: p.cmd}, patterns.Judge{Args: shell(judge), File: file}, p.opts)
	})
}

func cmdReflexion(c *cli.Context, g globals, inv *invocation) error {
	var p patternCmd
	k := c.Int("attempts")
	if err := p.parse(c, g, true); err != nil {
		return usageCode(inv, err)
	}
	if k < 1 {
		return usageCode(inv, usageErr("--attempts %d: want at least 1", k))
	}
	return p.run(c.Context, inv, func(ctx context.Context, s patterns.Brancher, parent string) (*patterns.Result, error) {
		return patterns.Reflexion(ctx, s, parent, k, patterns.Command{Args: p.cmd}, p.opts)
	})
}

func cmdSearch(c *cli.Context, g globals, inv *invocation) error {
	var p patternCmd
	beam := c.Command.Name == "beam"
	so := patterns.SearchOptions{Width: c.Int("width"), Depth: c.Int("depth")}
	if beam {
		so.Keep = c.Int("keep")
	} else {
		so.Budget = c.Int("budget")
	}
	if err := p.parse(c, g, true); err != nil {
		return usageCode(inv, err)
	}
	goal, err := p.goalValue()
	if err != nil {
		return usageCode(inv, err)
	}
	so.Goal = goal
	if so.Width < 1 || so.Depth < 1 || (beam && so.Keep < 1) || so.Budget < 0 {
		return usageCode(inv, usageErr("--width, --depth and --keep must be at least 1, --budget not negative"))
	}
	search := patterns.TreeSearch
	if beam {
		search = patterns.BeamSearch
	}
	return p.run(c.Context, inv, func(ctx context.Context, s patterns.Brancher, parent string) (*patterns.Result, error) {
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
