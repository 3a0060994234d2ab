//go:build linux

// Package branchctl is the command line of branchctl, which forks a running
// sandbox (a container on the runtime io.containerd.branch.v1 and the
// snapshotter branch) into branches, runs commands in them, and
// commits or aborts them: a thin layer over the Go client in package client
// (client.NewSandboxClient).
//
// Two binaries run it. cmd/branchctl, the command users type, links only
// what the everyday commands need, so that it starts fast; cmd/branchctl-full
// links the heavy commands' code too (serve, mcp, push, pull, save, load:
// the HTTP API, the MCP SDK, the registry code), and branchctl execs it for
// those (heavy.go). Both have the one command table, so that help,
// completion and usage errors are the same from either.
package branchctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/console"
	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

type globals struct {
	address, namespace string
	json               bool
}

// Run runs branchctl with args (the command line after the program's
// name) and returns its exit status: a command's own (exec, the patterns),
// 2 for bad usage, 1 for other errors. An error is printed with a hint to
// stderr, or with --json as one JSON document on stdout. actions are the
// heavy commands' actions this binary links (HeavyCommands); a heavy
// command without one is run by branchctl-full, which replaces this
// process.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, actions Actions) int {
	inv := &invocation{stdin: stdin, stdout: stdout, stderr: stderr, namespace: os.Getenv("CONTAINERD_NAMESPACE"), args: args, actions: actions}
	if inv.namespace == "" {
		inv.namespace = "default"
	}
	app := newApp(inv)
	// The shell's completion asks with a last flag, and urfave/cli gives
	// up on a line with "--" in it, which arrange may add.
	if n := len(args); n == 0 || args[n-1] != "--generate-bash-completion" {
		if trimFlags && !asksHelp(args) {
			onlyFlagsOf(app, args)
		}
		args = arrange(app, args)
	} else if slices.Contains(args, "--") {
		// Past "--" is the command a branch will run: nothing to offer,
		// and nothing may run (urfave/cli would run the command).
		return 0
	}
	err := app.RunContext(ctx, append([]string{app.Name}, args...))
	if err == nil {
		return inv.code
	}
	code := inv.code
	if errors.As(err, new(usageError)) && code == 0 {
		code = 2
	}
	if code == 0 {
		code = 1
	}
	name := "branchctl"
	if i := skipFlags(app.Flags, args); i < len(args) && app.Command(args[i]) != nil {
		name += " " + args[i]
	}
	hint := hintFor(err, inv.namespace, name == "branchctl self")
	if jsonWanted(args) {
		_ = PrintJSON(stdout, jsonError{Error: errorBody{Kind: client.ErrorKind(err), Message: err.Error(), Hint: hint}})
		return code
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	if hint != "" {
		fmt.Fprintf(stderr, "hint: %s\n", hint)
	}
	return code
}

// jsonWanted reports whether --json is among the flags (before "--"),
// even where they do not parse.
func jsonWanted(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--json", "-json", "--json=true", "-json=true":
			return true
		}
	}
	return false
}

// jsonError is what every command prints with --json when it fails
// (docs/branchctl.md#json-output).
type jsonError struct {
	Error errorBody `json:"error"`
}

type errorBody struct {
	// Kind is the errdefs kind, in kebab case: not-found, invalid-argument...
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Hint    string `json:"hint,omitempty"`
}

// hintFor says what to do about an error, where its kind tells.
func hintFor(err error, namespace string, self bool) string {
	var se *branch.StaleError
	switch {
	case self && errdefs.IsNotFound(err):
		return "see this branch's descendants and checkpoints with `branchctl self tree` and `branchctl self checkpoint ls`"
	case errors.As(err, &se):
		return fmt.Sprintf("branch %s lost to branch %s; fork again from the parent to keep exploring", se.Branch, se.Winner)
	case errors.Is(err, client.ErrNoSandbox):
		if namespace != "k8s.io" {
			return fmt.Sprintf("see the sandboxes of namespace %s with `branchctl ls` (Kubernetes pods are in namespace k8s.io: `branchctl -n k8s.io ls`)", strconv.Quote(namespace))
		}
		return "see the sandboxes with `branchctl -n k8s.io ls`"
	case errdefs.IsNotFound(err):
		return "see the sandbox's branches and checkpoints with `branchctl tree SANDBOX` and `branchctl checkpoint ls SANDBOX`"
	case errdefs.IsInvalidArgument(err):
		return "see `branchctl help`"
	}
	return ""
}

// splitRef splits SANDBOX/BRANCH.
func splitRef(s string, needBranch bool) (string, string, error) {
	sb, b, _ := strings.Cut(s, "/")
	if sb == "" {
		return "", "", fmt.Errorf("no sandbox named in %q: %w", s, errdefs.ErrInvalidArgument)
	}
	if needBranch && b == "" {
		return "", "", fmt.Errorf("%q names no branch: write SANDBOX/BRANCH (branch ids are in `branchctl tree %s`): %w", s, sb, errdefs.ErrInvalidArgument)
	}
	return sb, b, nil
}

func oneArg(pos []string, what string) (string, error) {
	if len(pos) != 1 {
		return "", fmt.Errorf("want exactly one %s, got %d arguments %v: %w", what, len(pos), pos, errdefs.ErrInvalidArgument)
	}
	return pos[0], nil
}

func dial(ctx context.Context, g globals, sandbox string) (*client.SandboxClient, error) {
	return client.NewSandboxClient(ctx, g.address, g.namespace, sandbox)
}

// PrintJSON prints v as the one JSON document of a command's --json.
func PrintJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func cmdFork(c *cli.Context, g globals, inv *invocation) error {
	ctx, stdout := c.Context, inv.stdout
	opts, memory := forkOptions(c)
	pos, cmd := split(c)
	ref, err := oneArg(pos, "SANDBOX or SANDBOX/BRANCH to fork")
	if err != nil {
		return err
	}
	sb, parent, err := splitRef(ref, false)
	if err != nil {
		return err
	}
	if opts.Memory, err = parseBytes(memory); err != nil {
		return err
	}
	opts.Parent, opts.Args = parent, cmd
	sc, err := dial(ctx, g, sb)
	if err != nil {
		return err
	}
	defer sc.Close()
	start := time.Now()
	res, err := sc.ForkResult(ctx, opts)
	if err != nil {
		return err
	}
	kids := res.Branches
	if g.json {
		return PrintJSON(stdout, kids)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BRANCH\tPARENT\tINIT PID\tSTATUS\tNET")
	for _, k := range kids {
		fmt.Fprintf(tw, "%s/%s\t%s\t%d\t%s\t%s\n", sb, k.ID, k.Parent, k.InitPid, k.Status, k.Net)
	}
	fmt.Fprintf(tw, "forked %d in %s\n", len(kids), time.Since(start).Round(time.Microsecond))
	if m := res.Memory; m != nil {
		fmt.Fprintf(tw, "memory: parent stopped %s, dump %s, restore %s, image %d bytes\n", m.Pause.Round(time.Microsecond), m.Dump.Round(time.Microsecond), m.Restore.Round(time.Microsecond), m.ImageBytes)
	}
	return tw.Flush()
}

// forkOptions reads forkFlags: the options, and --memory-limit as given.
func forkOptions(c *cli.Context) (client.ForkOptions, string) {
	return client.ForkOptions{
		Count: c.Int("n"), Seal: c.String("seal"), Net: c.String("net"),
		CPUs: c.Float64("cpus"), Pids: c.Int64("pids"), From: c.String("from"),
		WithMemory: c.Bool("memory"),
	}, c.String("memory-limit")
}

func parseBytes(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	mult := int64(1)
	switch strings.ToLower(s[len(s)-1:]) {
	case "k":
		mult = 1 << 10
	case "m":
		mult = 1 << 20
	case "g":
		mult = 1 << 30
	}
	if mult > 1 {
		s = s[:len(s)-1]
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("--memory-limit %q: want a positive number of bytes, optionally with k, m or g: %w", s, errdefs.ErrInvalidArgument)
	}
	return v * mult, nil
}

func cmdExec(c *cli.Context, g globals, inv *invocation) error {
	code, err := execIn(c, g, inv)
	return ran(inv, code, err)
}

func execIn(c *cli.Context, g globals, inv *invocation) (int, error) {
	ctx, stdin, stdout, stderr := c.Context, inv.stdin, inv.stdout, inv.stderr
	tty, env, cwd := c.Bool("tty"), c.StringSlice("env"), c.String("cwd")
	pos, cmd := split(c)
	ref, err := oneArg(pos, "SANDBOX/BRANCH")
	if err != nil {
		return 2, err
	}
	if len(cmd) == 0 {
		return 2, fmt.Errorf("no command: write `branchctl exec %s -- CMD...`: %w", ref, errdefs.ErrInvalidArgument)
	}
	sb, b, err := splitRef(ref, false)
	if err != nil {
		return 2, err
	}
	if b == "" || b == branch.RootID {
		// The sandbox's own processes are containerd's task's.
		return 2, fmt.Errorf("exec in %s itself: branchctl runs commands in its branches; in the sandbox, use nerdctl exec or ctr tasks exec (or the HTTP API's exec on branch 0): %w", sb, errdefs.ErrInvalidArgument)
	}
	sc, err := dial(ctx, g, sb)
	if err != nil {
		return 1, err
	}
	defer sc.Close()
	opts := client.ExecOptions{Args: cmd, Env: env, Cwd: cwd, Stdin: stdin, Stdout: stdout, Stderr: stderr}
	// With --json the command's output goes into the one JSON document
	// (exactly one on stdout), not around it.
	var outBuf, errBuf client.Output
	if g.json {
		if tty {
			return 2, fmt.Errorf("--json and -t: a terminal's output cannot go into JSON: %w", errdefs.ErrInvalidArgument)
		}
		opts.Stdout, opts.Stderr = &outBuf, &errBuf
	}
	var con console.Console
	if tty {
		opts.Terminal = true
		if cur, err := console.ConsoleFromFile(os.Stdin); err == nil {
			con = cur
			if err := con.SetRaw(); err != nil {
				return 1, fmt.Errorf("set terminal raw: %w", err)
			}
			defer func() { _ = con.Reset() }()
		}
	}
	// Signals are taken from here on: one that comes while the command
	// starts is passed to it once it runs.
	sigs := notifyStops()
	p, err := sc.Exec(ctx, b, opts)
	if err != nil {
		signal.Stop(sigs)
		return 1, err
	}
	defer forwardSignals(ctx, "exec", p.KillAll, sigs, stderr)()
	if con != nil {
		resize := func() {
			if ws, err := con.Size(); err == nil {
				_ = p.Resize(ctx, uint32(ws.Width), uint32(ws.Height))
			}
		}
		resize()
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, unix.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				resize()
			}
		}()
	}
	st, err := p.Wait(ctx)
	if err != nil {
		return 1, err
	}
	if g.json {
		if err := PrintJSON(stdout, execResult{ExitStatus: st, Stdout: outBuf.String(), Stderr: errBuf.String()}); err != nil {
			return 1, err
		}
	}
	if st.OOMKilled {
		fmt.Fprintf(stderr, "branchctl exec: %v was killed by the OOM killer: branch %s ran out of memory (fork with a larger --memory-limit)\n", cmd, ref)
	}
	if st.BranchEnded != "" {
		fmt.Fprintf(stderr, "branchctl exec: %v was killed with its branch: %s\n", cmd, st.BranchEnded)
	}
	return st.Code, nil
}

// forwardSignals passes the signals that would stop branchctl (Ctrl-C
// without a terminal, a supervisor's SIGTERM, a hangup) to the command and
// what it started (its session), as a terminal passes Ctrl-C to its
// foreground job, and branchctl goes on waiting for its exit: without it
// branchctl died and the command ran on in the branch. A second signal
// kills them (a shell's background jobs ignore SIGINT, and would hold the
// output, and branchctl, open). sigs is notifyStops'; kill is the
// process's KillAll; it returns the stop.
func forwardSignals(ctx context.Context, cmd string, kill func(context.Context, uint32) error, sigs chan os.Signal, stderr io.Writer) func() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		first := true
		for s := range sigs {
			sig := s.(unix.Signal)
			if !first {
				sig = unix.SIGKILL
			} else {
				fmt.Fprintf(stderr, "branchctl %s: %v passed to the command; again to kill it and what it started\n", cmd, s)
			}
			first = false
			_ = kill(context.WithoutCancel(ctx), uint32(sig))
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(sigs)
		<-done
	}
}

// notifyStops takes the signals forwardSignals passes on.
func notifyStops() chan os.Signal {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT)
	return sigs
}

// execResult is exec's --json document.
type execResult struct {
	client.ExitStatus
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
}

// refArg is the one SANDBOX/BRANCH (SANDBOX for tree) a command takes.
func refArg(c *cli.Context, name string) (string, string, error) {
	pos, _ := split(c)
	ref, err := oneArg(pos, "SANDBOX/BRANCH")
	if err != nil {
		return "", "", err
	}
	return splitRef(ref, name != "tree")
}

// dialRef dials the sandbox of the command's SANDBOX/BRANCH argument (for
// tree, SANDBOX) and returns the names too.
func dialRef(c *cli.Context, g globals, name string) (*client.SandboxClient, string, string, error) {
	sb, b, err := refArg(c, name)
	if err != nil {
		return nil, "", "", err
	}
	sc, err := dial(c.Context, g, sb)
	return sc, sb, b, err
}

func cmdCommit(c *cli.Context, g globals, inv *invocation) error {
	ctx, stdout := c.Context, inv.stdout
	sc, sb, b, err := dialRef(c, g, "commit")
	if err != nil {
		return err
	}
	defer sc.Close()
	start := time.Now()
	res, err := sc.Commit(ctx, b)
	if err != nil {
		return err
	}
	if g.json {
		return PrintJSON(stdout, res)
	}
	fmt.Fprintf(stdout, "committed %s/%s into %s (epoch %d) in %s", sb, b, nodeName(res.Parent.ID), res.Parent.Epoch, time.Since(start).Round(time.Microsecond))
	if len(res.Invalidated) > 0 {
		fmt.Fprintf(stdout, "; invalidated %s", strings.Join(res.Invalidated, ", "))
	}
	fmt.Fprintln(stdout)
	return nil
}

func nodeName(id string) string {
	if id == "" || id == branch.RootID {
		return "the sandbox"
	}
	return "branch " + id
}

func cmdLogs(c *cli.Context, g globals, inv *invocation) error {
	ctx, stdout := c.Context, inv.stdout
	sc, _, b, err := dialRef(c, g, "logs")
	if err != nil {
		return err
	}
	defer sc.Close()
	out, err := sc.Output(ctx, b)
	if err != nil {
		return err
	}
	return printOutput(stdout, g, out)
}

// printOutput prints a branch's output (logs, self logs) as it was
// written, or with --json as text: bytes that are not UTF-8 become U+FFFD.
func printOutput(stdout io.Writer, g globals, out []byte) error {
	if g.json {
		return PrintJSON(stdout, map[string]string{"output": string(out)})
	}
	_, err := stdout.Write(out)
	return err
}

func cmdAbort(c *cli.Context, g globals, inv *invocation) error {
	ctx, stdout := c.Context, inv.stdout
	sc, _, b, err := dialRef(c, g, "abort")
	if err != nil {
		return err
	}
	defer sc.Close()
	ids, err := sc.Abort(ctx, b)
	if err != nil {
		return err
	}
	if g.json {
		return PrintJSON(stdout, map[string][]string{"aborted": ids})
	}
	fmt.Fprintf(stdout, "aborted %s\n", strings.Join(ids, ", "))
	return nil
}

func cmdTree(c *cli.Context, g globals, inv *invocation) error {
	ctx, stdout := c.Context, inv.stdout
	sc, sb, _, err := dialRef(c, g, "tree")
	if err != nil {
		return err
	}
	defer sc.Close()
	nodes, err := sc.Tree(ctx)
	if err != nil {
		return err
	}
	// The shim records the sandbox at its first fork; its
	// age is the container's.
	for i := range nodes {
		if nodes[i].ID == branch.RootID && !sc.Created.IsZero() {
			nodes[i].Created = sc.Created
		}
	}
	if g.json {
		return PrintJSON(stdout, nodes)
	}
	return PrintTree(stdout, sb, nodes, time.Now())
}

// PrintTree prints a sandbox's branches as an indented tree, live ones
// first under their parents, then the ended ones.
func PrintTree(w io.Writer, sandbox string, nodes []client.BranchInfo, now time.Time) error {
	kids := map[string][]client.BranchInfo{}
	var ended []client.BranchInfo
	byID := map[string]bool{}
	for _, n := range nodes {
		byID[n.ID] = true
	}
	for _, n := range nodes {
		switch {
		case n.ID == branch.RootID:
		case n.State == branch.Live || n.State == branch.Committing:
			kids[n.Parent] = append(kids[n.Parent], n)
		default:
			ended = append(ended, n)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BRANCH\tSTATE\tEPOCH\tSTATUS\tSEAL\tPROCS\tUPPER\tAGE")
	var walk func(id, indent string)
	walk = func(id, indent string) {
		list := kids[id]
		sort.Slice(list, func(i, j int) bool { return numLess(list[i].ID, list[j].ID) })
		for _, n := range list {
			fmt.Fprintf(tw, "%s└─ %s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", indent, n.ID, n.State, n.Epoch, n.Status, seal(n), len(n.Pids), size(n.UpperSize), age(n, now))
			walk(n.ID, indent+"   ")
		}
	}
	for _, n := range nodes {
		if n.ID == branch.RootID {
			fmt.Fprintf(tw, "%s (0)\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", sandbox, n.State, n.Epoch, n.Status, seal(n), len(n.Pids), size(n.UpperSize), age(n, now))
		}
	}
	walk(branch.RootID, "")
	for _, n := range nodes {
		if n.ID == branch.RootID && n.Quarantine != "" {
			fmt.Fprintf(tw, "QUARANTINED: %s\n", n.Quarantine)
		}
		if n.ID == branch.RootID && n.Status == "paused" {
			fmt.Fprintf(tw, "PAUSED: %s and its branches are frozen; fork, exec, commit and abort are refused until it is resumed\n", sandbox)
		}
	}
	sort.Slice(ended, func(i, j int) bool { return numLess(ended[i].ID, ended[j].ID) })
	for _, n := range ended {
		what := string(n.State)
		if n.State == branch.Stale {
			what = fmt.Sprintf("stale (branch %s won)", n.Winner)
		}
		fmt.Fprintf(tw, "   %s (ended)\t%s\t%d\t\t\t\t\t%s\n", n.ID, what, n.Epoch, age(n, now))
	}
	return tw.Flush()
}

// seal says how a branch is sealed while it has branches: its rootfs
// read-only (--seal ro), or its processes frozen too (--seal freeze).
func seal(n client.BranchInfo) string {
	if !n.Sealed {
		return "none"
	}
	switch n.Seal {
	case "freeze":
		return "frozen"
	case "", "ro":
		return "read-only"
	}
	return n.Seal
}

func numLess(a, b string) bool {
	x, _ := strconv.Atoi(a)
	y, _ := strconv.Atoi(b)
	return x < y
}

func size(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1fM", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fK", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

func age(n client.BranchInfo, now time.Time) string {
	if n.Created.IsZero() {
		return ""
	}
	return now.Sub(n.Created).Round(time.Millisecond).String()
}
