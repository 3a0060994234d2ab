//go:build linux

// Command branchctl forks a running sandbox (a container on the runtime
// io.containerd.branch.v1 and the snapshotter branch) into branch contexts,
// runs commands in them, and commits or aborts them. It is a thin layer over
// the Go client in package client (client.NewSandboxClient).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/console"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

const usageHead = `usage: branchctl [--address ADDR] [--namespace NS] COMMAND ...

Branch contexts of a live sandbox (a container run with
--runtime io.containerd.branch.v1 --snapshotter branch, or on the CRI
runtime handler branch, in namespace k8s.io):

  fork SANDBOX[/BRANCH] -n N [--from CHECKPOINT] [--seal ro|freeze]
       [--net shared|isolated] [--memory BYTES] [--cpus N] [--pids N] [-- CMD...]
                                  make N branches, each with a running init
                                  (or CMD as its init); --from: starting
                                  from a checkpoint of that context
  exec [-t] SANDBOX/BRANCH -- CMD...
                                  run CMD in a branch (stdio, exit code)
  commit SANDBOX/BRANCH           make a branch's changes its parent's;
                                  the first commit wins, siblings go
  abort SANDBOX/BRANCH            kill and discard a branch
  ls                              the sandboxes (containers on the branch
                                  runtime): id, name, status, live branches
  tree SANDBOX                    every context: state, epoch, processes,
                                  upper size, age
  checkpoint SANDBOX[/BRANCH] NAME
                                  record the context's rootfs as NAME (cost:
                                  what changed since its last checkpoint)
  checkpoint ls SANDBOX           every checkpoint: context, base, size, age
  checkpoint rm SANDBOX NAME      delete one (not while a branch is forked
                                  from it); checkpoints built on it keep
                                  its layer while they need it
  rollback SANDBOX[/BRANCH] NAME  bring the context's rootfs back to NAME,
                                  under its running processes
  push SANDBOX[/BRANCH|@CHECKPOINT] REF [--plain-http] [--user USER[:SECRET]]
       [--hosts-dir DIR]          push the context as an OCI image: the
                                  sandbox image's layers, one layer per
                                  checkpoint on the path, one of the change
                                  since (see docs/registry.md)
  pull REF SANDBOX [--plain-http] [--user U[:S]] [-- CMD...]
                                  make a sandbox (not started) of an image
                                  push made, with its checkpoints restored
  save SANDBOX[/BRANCH] FILE [--name NAME]
                                  the same image as an OCI layout tar
  load FILE [--snapshotter branch]
                                  import such a tar, unpacked, to run
  self fork|exec|commit|abort|tree|checkpoint|rollback ...
                                  from inside a sandbox: the same on its own
                                  context, through /run/branchbox/branch.sock
                                  (see branchctl self help)

`

const usage = usageHead + patternsUsage + usageTail

const usageTail = `
A SANDBOX is a container's id, a unique id prefix, its nerdctl name, or
its CRI name (NAME or POD/NAME, namespace k8s.io).
Every command takes --json: one JSON document on stdout, also on error
({"error": {"kind", "message", "hint"}}; docs/branchctl.md).
--address and --namespace default to
$CONTAINERD_ADDRESS and $CONTAINERD_NAMESPACE, then to
/run/containerd/containerd.sock and "default".
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

type globals struct {
	address, namespace string
	json               bool
}

func (g *globals) register(fs *flag.FlagSet) {
	addr := os.Getenv("CONTAINERD_ADDRESS")
	if addr == "" {
		addr = "/run/containerd/containerd.sock"
	}
	ns := os.Getenv("CONTAINERD_NAMESPACE")
	if ns == "" {
		ns = "default"
	}
	fs.StringVar(&g.address, "address", addr, "containerd's socket")
	fs.StringVar(&g.address, "a", addr, "containerd's socket (short)")
	fs.StringVar(&g.namespace, "namespace", ns, "containerd namespace")
	fs.StringVar(&g.namespace, "n", ns, "containerd namespace (short; not in fork, where -n is the count)")
	fs.BoolVar(&g.json, "json", false, "print JSON")
}

// commandFlags lets a command's own flags set the globals again after its
// name (branchctl push --namespace k8s.io ...).
func (g *globals) commandFlags(fs *flag.FlagSet) {
	fs.StringVar(&g.address, "address", g.address, "containerd's socket")
	fs.StringVar(&g.namespace, "namespace", g.namespace, "containerd namespace")
	fs.BoolVar(&g.json, "json", g.json, "print JSON")
}

// parse parses flags anywhere before "--" (Go's flag package stops at the
// first positional argument) and returns the positional arguments and the
// command after "--".
func parse(fs *flag.FlagSet, args []string) (pos, cmd []string, err error) {
	var flags []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			cmd = args[i+1:]
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // flag.Parse reports it
		}
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	if err := fs.Parse(flags); err != nil {
		return nil, nil, err
	}
	return pos, cmd, nil
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var g globals
	top := flag.NewFlagSet("branchctl", flag.ContinueOnError)
	top.SetOutput(stderr)
	top.Usage = func() { fmt.Fprint(stderr, usage) }
	g.register(top)
	// Global flags come before the command.
	i := 0
	for i < len(args) && strings.HasPrefix(args[i], "-") {
		i++
		if !strings.Contains(args[i-1], "=") && args[i-1] != "--json" && i < len(args) {
			i++
		}
	}
	if err := top.Parse(args[:i]); err != nil {
		return 2
	}
	if i >= len(args) {
		fmt.Fprint(stderr, usage)
		return 2
	}
	name, rest := args[i], args[i+1:]
	wantJSON := g.json || jsonAfter(rest)
	var err error
	code := 0
	switch name {
	case "ls":
		err = cmdLs(ctx, g, rest, stdout)
	case "fork":
		err = cmdFork(ctx, g, rest, stdout)
	case "exec":
		code, err = cmdExec(ctx, g, rest, stdin, stdout, stderr)
	case "commit":
		err = cmdCommit(ctx, g, rest, stdout)
	case "abort":
		err = cmdAbort(ctx, g, rest, stdout)
	case "tree":
		err = cmdTree(ctx, g, rest, stdout)
	case "checkpoint":
		err = cmdCheckpoint(ctx, g, rest, stdout)
	case "rollback":
		err = cmdRollback(ctx, g, rest, stdout)
	case "push":
		err = cmdPush(ctx, g, rest, stdout)
	case "pull":
		err = cmdPull(ctx, g, rest, stdout)
	case "save":
		err = cmdSave(ctx, g, rest, stdout)
	case "load":
		err = cmdLoad(ctx, g, rest, stdout)
	case "self":
		code, err = cmdSelf(ctx, g, rest, stdout, stderr)
	case "speculate":
		code, err = cmdSpeculate(ctx, g, rest, stdout)
	case "best-of-n":
		code, err = cmdBestOfN(ctx, g, rest, stdout)
	case "tournament":
		code, err = cmdTournament(ctx, g, rest, stdout)
	case "reflexion":
		code, err = cmdReflexion(ctx, g, rest, stdout)
	case "beam", "tree-search":
		code, err = cmdSearch(ctx, g, name, rest, stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = fmt.Errorf("unknown command %s (see branchctl help): %w", strconv.Quote(name), errdefs.ErrInvalidArgument)
		code = 2
		if !wantJSON {
			fmt.Fprintf(stderr, "branchctl: unknown command %s\n\n%s", strconv.Quote(name), usage)
			return code
		}
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if code == 0 {
			code = 1
		}
		hint := hintFor(err, g.namespace)
		if wantJSON {
			_ = printJSON(stdout, jsonError{Error: errorBody{Kind: errKind(err), Message: err.Error(), Hint: hint}})
			return code
		}
		fmt.Fprintf(stderr, "branchctl %s: %v\n", name, err)
		if hint != "" {
			fmt.Fprintf(stderr, "hint: %s\n", hint)
		}
	}
	return code
}

// jsonAfter reports whether --json is among a command's flags (before "--").
func jsonAfter(args []string) bool {
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

// errKind names an error's errdefs kind.
func errKind(err error) string {
	var se *branch.StaleError
	for _, k := range []struct {
		is   func(error) bool
		name string
	}{
		{func(err error) bool { return errors.As(err, &se) }, "stale"},
		{errdefs.IsNotFound, "not-found"},
		{errdefs.IsInvalidArgument, "invalid-argument"},
		{errdefs.IsAlreadyExists, "already-exists"},
		{errdefs.IsFailedPrecondition, "failed-precondition"},
		{errdefs.IsConflict, "conflict"},
		{errdefs.IsUnavailable, "unavailable"},
		{errdefs.IsNotImplemented, "not-implemented"},
		{errdefs.IsPermissionDenied, "permission-denied"},
		{errdefs.IsResourceExhausted, "resource-exhausted"},
		{errdefs.IsAborted, "aborted"},
		{errdefs.IsCanceled, "canceled"},
		{errdefs.IsDeadlineExceeded, "deadline-exceeded"},
	} {
		if k.is(err) {
			return k.name
		}
	}
	return "unknown"
}

// hintFor says what to do about an error, where its kind tells.
func hintFor(err error, namespace string) string {
	var se *branch.StaleError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("branch %s lost to branch %s; fork again from the parent to keep exploring", se.Branch, se.Winner)
	case errors.Is(err, client.ErrNoSandbox):
		if namespace != "k8s.io" {
			return fmt.Sprintf("see the sandboxes of namespace %s with `branchctl ls` (Kubernetes pods are in namespace k8s.io: `branchctl -n k8s.io ls`)", strconv.Quote(namespace))
		}
		return "see the sandboxes with `branchctl -n k8s.io ls`"
	case errdefs.IsNotFound(err):
		return "see the sandbox's contexts and checkpoints with `branchctl tree SANDBOX` and `branchctl checkpoint ls SANDBOX`"
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

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func cmdFork(ctx context.Context, g globals, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("fork", flag.ContinueOnError)
	var opts client.ForkOptions
	var memory string
	g.commandFlags(fs)
	forkFlags(fs, &opts, &memory)
	pos, cmd, err := parse(fs, args)
	if err != nil {
		return err
	}
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
	c, err := dial(ctx, g, sb)
	if err != nil {
		return err
	}
	defer c.Close()
	start := time.Now()
	kids, err := c.Fork(ctx, opts)
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(stdout, kids)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BRANCH\tPARENT\tINIT PID\tSTATUS\tNET")
	for _, k := range kids {
		fmt.Fprintf(tw, "%s/%s\t%s\t%d\t%s\t%s\n", sb, k.ID, k.Parent, k.InitPid, k.Status, k.Net)
	}
	fmt.Fprintf(tw, "forked %d in %s\n", len(kids), time.Since(start).Round(time.Microsecond))
	return tw.Flush()
}

// forkFlags registers the options of a fork (fork, self fork).
func forkFlags(fs *flag.FlagSet, opts *client.ForkOptions, memory *string) {
	fs.IntVar(&opts.Count, "n", 1, "number of branches")
	fs.StringVar(&opts.Seal, "seal", "ro", "how the parent is sealed while it has branches: ro (rootfs read-only) or freeze (processes frozen too)")
	fs.StringVar(&opts.Net, "net", "shared", "network: shared (the parent's namespace) or isolated (loopback only)")
	fs.StringVar(memory, "memory", "", "memory limit per branch (bytes, or with k, m, g); default the parent's")
	fs.Float64Var(&opts.CPUs, "cpus", 0, "CPU limit per branch; default the parent's")
	fs.Int64Var(&opts.Pids, "pids", 0, "process limit per branch; default the parent's")
	fs.StringVar(&opts.From, "from", "", "fork from this checkpoint of the context instead of its current state")
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
		return 0, fmt.Errorf("--memory %q: want a positive number of bytes, optionally with k, m or g: %w", s, errdefs.ErrInvalidArgument)
	}
	return v * mult, nil
}

func cmdExec(ctx context.Context, g globals, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	var tty bool
	var env multi
	var cwd string
	fs.StringVar(&g.address, "address", g.address, "containerd's socket")
	fs.StringVar(&g.namespace, "namespace", g.namespace, "containerd namespace")
	fs.BoolVar(&g.json, "json", g.json, "print the exit status and the command's output as one JSON document")
	fs.BoolVar(&tty, "t", false, "allocate a terminal")
	fs.BoolVar(&tty, "tty", false, "allocate a terminal")
	fs.Var(&env, "env", "add an environment variable (K=V), repeatable")
	fs.StringVar(&cwd, "cwd", "", "working directory")
	pos, cmd, err := parse(fs, args)
	if err != nil {
		return 2, err
	}
	ref, err := oneArg(pos, "SANDBOX/BRANCH")
	if err != nil {
		return 2, err
	}
	if len(cmd) == 0 {
		return 2, fmt.Errorf("no command: write `branchctl exec %s -- CMD...`: %w", ref, errdefs.ErrInvalidArgument)
	}
	sb, b, err := splitRef(ref, true)
	if err != nil {
		return 2, err
	}
	c, err := dial(ctx, g, sb)
	if err != nil {
		return 1, err
	}
	defer c.Close()
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
	p, err := c.Exec(ctx, b, opts)
	if err != nil {
		return 1, err
	}
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
		if err := printJSON(stdout, execResult{ExitStatus: st, Stdout: outBuf.String(), Stderr: errBuf.String()}); err != nil {
			return 1, err
		}
	}
	if st.OOMKilled {
		fmt.Fprintf(stderr, "branchctl exec: %v was killed by the OOM killer: branch %s ran out of memory (fork with a larger --memory)\n", cmd, ref)
	}
	return st.Code, nil
}

// execResult is exec's --json document.
type execResult struct {
	client.ExitStatus
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func refCmd(g *globals, name string, args []string) (string, string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	g.commandFlags(fs)
	pos, _, err := parse(fs, args)
	if err != nil {
		return "", "", err
	}
	ref, err := oneArg(pos, "SANDBOX/BRANCH")
	if err != nil {
		return "", "", err
	}
	return splitRef(ref, name != "tree")
}

func cmdCommit(ctx context.Context, g globals, args []string, stdout io.Writer) error {
	sb, b, err := refCmd(&g, "commit", args)
	if err != nil {
		return err
	}
	c, err := dial(ctx, g, sb)
	if err != nil {
		return err
	}
	defer c.Close()
	start := time.Now()
	res, err := c.Commit(ctx, b)
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(stdout, res)
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

func cmdAbort(ctx context.Context, g globals, args []string, stdout io.Writer) error {
	sb, b, err := refCmd(&g, "abort", args)
	if err != nil {
		return err
	}
	c, err := dial(ctx, g, sb)
	if err != nil {
		return err
	}
	defer c.Close()
	ids, err := c.Abort(ctx, b)
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(stdout, map[string][]string{"aborted": ids})
	}
	fmt.Fprintf(stdout, "aborted %s\n", strings.Join(ids, ", "))
	return nil
}

func cmdTree(ctx context.Context, g globals, args []string, stdout io.Writer) error {
	sb, _, err := refCmd(&g, "tree", args)
	if err != nil {
		return err
	}
	c, err := dial(ctx, g, sb)
	if err != nil {
		return err
	}
	defer c.Close()
	nodes, err := c.Tree(ctx)
	if err != nil {
		return err
	}
	// The shim records the sandbox's own context at its first fork; its
	// age is the container's.
	for i := range nodes {
		if nodes[i].ID == branch.RootID && !c.Created.IsZero() {
			nodes[i].Created = c.Created
		}
	}
	if g.json {
		return printJSON(stdout, nodes)
	}
	return PrintTree(stdout, sb, nodes, time.Now())
}

// PrintTree prints a sandbox's contexts as an indented tree, live ones
// first under their parents, then the ended ones.
func PrintTree(w io.Writer, sandbox string, nodes []client.ContextInfo, now time.Time) error {
	kids := map[string][]client.ContextInfo{}
	var ended []client.ContextInfo
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
	fmt.Fprintln(tw, "CONTEXT\tSTATE\tEPOCH\tSTATUS\tSEAL\tPROCS\tUPPER\tAGE")
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

// seal says how a context is sealed while it has branches: its rootfs
// read-only (--seal ro), or its processes frozen too (--seal freeze).
func seal(n client.ContextInfo) string {
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

func age(n client.ContextInfo, now time.Time) string {
	if n.Created.IsZero() {
		return ""
	}
	return now.Sub(n.Created).Round(time.Millisecond).String()
}
