//go:build linux

package branchctl

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"
)

const defaultAddress = "/run/containerd/containerd.sock"

// invocation is one run of branchctl: its streams, and the exit status a
// command chose (exec and the patterns exit as their work did).
type invocation struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	code           int
	// namespace is the containerd namespace the command ran in, for hints.
	namespace string
	// args is the command line as given, which a heavy command hands on
	// to branchctl-full; actions are the heavy commands this binary runs
	// itself.
	args    []string
	actions Actions
}

// ran sets the exit status a command chose (exec, self, the patterns)
// and passes its error on.
func ran(inv *invocation, code int, err error) error {
	inv.code = code
	return err
}

// usageError is a command line that could not be parsed: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usage(err error) error {
	return usageError{fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)}
}

// newApp is branchctl's command line. Each run makes its own, so that
// flag values never outlive it.
func newApp(inv *invocation) *cli.App {
	app := &cli.App{
		Name:  "branchctl",
		Usage: "fork a live sandbox into branches, run commands in them, commit or abort them",
		Description: `A sandbox is a container run with --runtime io.containerd.branch.v1
--snapshotter branch (or on the CRI runtime handler branch, in namespace
k8s.io), named by its id, a unique id prefix, its nerdctl name, or its CRI
name (NAME or POD/NAME). A branch is named SANDBOX/BRANCH; SANDBOX alone
names the sandbox itself.

Every command takes --json: one JSON document on stdout, also on error
({"error": {"kind", "message", "hint"}}; docs/branchctl.md).
Shell completion: source <(branchctl completion bash).`,
		Flags:                     globalFlags(true),
		Commands:                  commands(inv),
		Reader:                    inv.stdin,
		Writer:                    inv.stdout,
		ErrWriter:                 inv.stderr,
		EnableBashCompletion:      true,
		HideVersion:               true,
		DisableSliceFlagSeparator: true, // --env K=a,b is one variable
		// Errors are printed by run, as text or JSON, with a hint.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return usage(err)
		},
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usage(fmt.Errorf("unknown command %s (see branchctl help)", strconv.Quote(c.Args().First())))
			}
			// No command: the help goes where an error would.
			c.App.Writer = inv.stderr
			_ = cli.ShowAppHelp(c)
			inv.code = 2
			return nil
		},
	}
	finish(app.Commands)
	return app
}

// finish makes a flag that does not parse a usage error of the command,
// printed by run like any other, and keeps a help subcommand (which the
// shell would complete) to the commands that have subcommands.
func finish(cmds []*cli.Command) {
	for _, c := range cmds {
		c.OnUsageError = func(_ *cli.Context, err error, _ bool) error { return usage(err) }
		c.HideHelpCommand = len(c.Subcommands) == 0
		finish(c.Subcommands)
	}
}

// globalFlags are containerd's address and namespace and --json. They are
// given before the command (top) or after it, as in
// `branchctl push --namespace k8s.io ...`; after it they have no default,
// so that globalsOf can tell they were given there.
func globalFlags(top bool) []cli.Flag {
	address := &cli.StringFlag{Name: "address", Usage: "containerd's socket (default $CONTAINERD_ADDRESS, then " + defaultAddress + ")"}
	namespace := &cli.StringFlag{Name: "namespace", Usage: `containerd namespace (default $CONTAINERD_NAMESPACE, then "default")`}
	jsonFlag := &cli.BoolFlag{Name: "json", Usage: "print one JSON document on stdout, also on error"}
	if top {
		address.Aliases, address.EnvVars = []string{"a"}, []string{"CONTAINERD_ADDRESS"}
		namespace.Aliases, namespace.EnvVars = []string{"n"}, []string{"CONTAINERD_NAMESPACE"}
		return []cli.Flag{address, namespace, jsonFlag}
	}
	address.Category, namespace.Category, jsonFlag.Category = "global", "global", "global"
	return []cli.Flag{address, namespace, jsonFlag}
}

// withGlobals is a command's flags with the global ones.
func withGlobals(flags ...cli.Flag) []cli.Flag {
	return append(globalFlags(false), flags...)
}

// globalsOf reads the global flags where they were given last: after the
// command, before it, or from the environment.
func globalsOf(c *cli.Context) globals {
	lineage := c.Lineage()
	// By long name only: -n is the namespace before the command but a
	// count after fork (urfave/cli sets both names of a flag given by one).
	given := func(name string) *cli.Context {
		for _, l := range lineage {
			if slices.Contains(l.LocalFlagNames(), name) {
				return l
			}
		}
		return nil
	}
	g := globals{address: defaultAddress, namespace: "default"}
	if l := given("address"); l != nil && l.String("address") != "" {
		g.address = l.String("address")
	}
	if l := given("namespace"); l != nil && l.String("namespace") != "" {
		g.namespace = l.String("namespace")
	}
	for _, l := range lineage {
		if slices.Contains(l.LocalFlagNames(), "json") && l.Bool("json") {
			g.json = true
		}
	}
	return g
}

// split returns a command's positional arguments and the command line
// after "--" (arrange puts the positional arguments after a "--" of
// their own).
func split(c *cli.Context) (pos, cmd []string) {
	args := c.Args().Slice()
	if i := slices.Index(args, "--"); i >= 0 {
		return args[:i], args[i+1:]
	}
	return args, nil
}

// arrange lets flags follow a command's positional arguments, as they
// always could (branchctl fork sb -n 3): urfave/cli, like Go's flag
// package, stops at the first one. The command's flags (up to "--") move
// before its positional arguments, which follow a "--" so that split can
// tell them from the command after the user's "--".
func arrange(app *cli.App, args []string) []string {
	i := skipFlags(app.Flags, args)
	if i >= len(args) {
		return args
	}
	cmd := app.Command(args[i])
	if cmd == nil {
		return args
	}
	i++
	for len(cmd.Subcommands) > 0 {
		j := skipFlags(cmd.Flags, args[i:]) + i
		if j >= len(args) {
			return args
		}
		sub := cmd.Command(args[j])
		if sub == nil {
			return args
		}
		cmd, i = sub, j+1
	}
	var flags, pos, after []string
	rest := args[i:]
	for k := 0; k < len(rest); k++ {
		a := rest[k]
		if a == "--" {
			after = append([]string{"--"}, rest[k+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		if lim, ok := memoryLimitFlag(a, rest[k+1:]); ok && takesValue(cmd.Flags, "--memory-limit") {
			// The old spelling of --memory-limit.
			flags = append(flags, lim...)
			k += len(lim) - 1
			continue
		}
		flags = append(flags, a)
		if takesValue(cmd.Flags, a) && k+1 < len(rest) {
			k++
			flags = append(flags, rest[k])
		}
	}
	out := append(slices.Clone(args[:i]), flags...)
	if len(pos) > 0 || len(after) > 0 {
		out = append(append(out, "--"), pos...)
	}
	return append(out, after...)
}

// trimFlags is whether Run calls onlyFlagsOf (TestOnlyFlagsOf compares).
var trimFlags = true

// onlyFlagsOf drops the flags of every command but the one args run,
// when that is not help (asksHelp) nor fish's completion, which show
// others'.
// urfave/cli renders every flag of every command when it sets the app up
// (their usage, default and environment, for help's flag categories,
// which the global flags after a command have): 0.3-0.4 ms of every
// start, a tenth of branchctl's, for flags that run never shows: a
// command's usage errors name its own flags only.
func onlyFlagsOf(app *cli.App, args []string) {
	i := skipFlags(app.Flags, args)
	if i >= len(args) {
		return
	}
	run := app.Command(args[i])
	if run == nil || run.Name == "completion" && slices.Contains(args[i:], "fish") {
		return
	}
	for _, c := range app.Commands {
		if c != run {
			c.Flags = nil
		}
	}
}

// asksHelp reports whether a command line may ask urfave/cli for help,
// which can show any command's flags (`branchctl checkpoint ls --help`
// shows ls's): a help flag or a help word before "--". It errs towards
// yes (a sandbox named h, --seal help), which only costs onlyFlagsOf's
// saving.
func asksHelp(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); name == "h" || name == "help" {
			return true
		}
	}
	return false
}

// memoryLimitFlag reads --memory SIZE and --memory=SIZE, the spelling of
// --memory-limit before --memory meant a memory fork, as --memory-limit: a
// size (digits, then k, m or g) is never a sandbox's name nor a boolean.
func memoryLimitFlag(a string, next []string) ([]string, bool) {
	name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
	if name != "memory" {
		return nil, false
	}
	if hasVal {
		if isSize(val) {
			return []string{"--memory-limit=" + val}, true
		}
		return nil, false
	}
	if len(next) > 0 && isSize(next[0]) {
		return []string{"--memory-limit", next[0]}, true
	}
	return nil, false
}

// isSize says whether s is a byte count as --memory-limit takes it.
func isSize(s string) bool {
	s = strings.TrimRight(strings.ToLower(s), "kmg")
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// skipFlags returns the index of the first argument that is not one of
// flags (or a value of one).
func skipFlags(flags []cli.Flag, args []string) int {
	i := 0
	for i < len(args) && strings.HasPrefix(args[i], "-") && args[i] != "-" && args[i] != "--" {
		if takesValue(flags, args[i]) {
			i++
		}
		i++
	}
	return i
}

// takesValue reports whether arg is a flag of flags that takes its value
// from the next argument. An unknown flag takes none: parsing it then
// reports it.
func takesValue(flags []cli.Flag, arg string) bool {
	name := strings.TrimLeft(arg, "-")
	if strings.Contains(name, "=") {
		return false
	}
	for _, f := range flags {
		if !slices.Contains(f.Names(), name) {
			continue
		}
		_, isBool := f.(*cli.BoolFlag)
		return !isBool
	}
	return false
}

// completionCommand prints a shell's completion script for branchctl,
// which asks branchctl itself (urfave/cli's --generate-bash-completion).
func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script: source <(branchctl completion bash)",
		ArgsUsage: "bash|zsh|fish",
		Action: func(c *cli.Context) error {
			switch c.Args().First() {
			case "bash":
				_, err := io.WriteString(c.App.Writer, bashCompletion)
				return err
			case "zsh":
				_, err := io.WriteString(c.App.Writer, "autoload -U +X bashcompinit && bashcompinit\n"+bashCompletion)
				return err
			case "fish":
				s, err := c.App.ToFishCompletion()
				if err != nil {
					return err
				}
				_, err = io.WriteString(c.App.Writer, s)
				return err
			}
			return usage(fmt.Errorf("completion: want bash, zsh or fish, got %q", c.Args().Slice()))
		},
	}
}

// bashCompletion is urfave/cli's bash_autocomplete for branchctl.
const bashCompletion = `_branchctl_complete() {
  local cur words
  COMPREPLY=()
  cur="${COMP_WORDS[COMP_CWORD]}"
  words=("${COMP_WORDS[@]:0:$COMP_CWORD}")
  local opts
  if [[ "$cur" == "-"* ]]; then
    opts=$("${words[@]}" "$cur" --generate-bash-completion 2>/dev/null)
  else
    opts=$("${words[@]}" --generate-bash-completion 2>/dev/null)
  fi
  COMPREPLY=($(compgen -W "${opts}" -- "${cur}"))
}
complete -o bashdefault -o default -F _branchctl_complete branchctl
`
