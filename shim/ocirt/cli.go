//go:build linux

// Package ocirt is the OCI runtime half of containerd-shim-branch-v1: the
// subset of runc's command line that containerd's runc task service drives
// through go-runc (create, start, exec, kill, delete, state, ps, pause,
// resume, update, events --stats, features), implemented on runc's
// libcontainer as a library. The command bodies are ported from runc's own
// CLI (github.com/opencontainers/runc, package main, Apache-2.0) so that
// behaviour and error texts match what the task service expects from runc.
package ocirt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
)

// IsInvocation reports whether args (os.Args) is a runtime call. go-runc
// always puts --root first, because containerd's task service always sets a
// state root, and the shim's own flags (-namespace, -id, -address, ...) never
// include it; "features" is how containerd and tools probe a runtime.
func IsInvocation(args []string) bool {
	return len(args) > 1 && (args[1] == "--root" || strings.HasPrefix(args[1], "--root=") || args[1] == "features")
}

// globals are runc's global flags that go-runc passes.
type globals struct {
	root      string
	debug     bool
	log       string
	logFormat string
	systemd   bool
}

// cmdline is one parsed command: its flags and positional arguments.
type cmdline struct {
	g     globals
	name  string
	flags map[string]string // bool flags hold "true"
	args  []string
}

func (c *cmdline) str(name string) string { return c.flags[name] }

func (c *cmdline) bool(name string) bool {
	v, ok := c.flags[name]
	if !ok {
		return false
	}
	b, err := strconv.ParseBool(v)
	return err == nil && b
}

// boolFlag reports whether a command flag takes no value (the names are
// unambiguous across the commands go-runc uses).
func boolFlag(flag string) bool {
	switch flag {
	case "detach", "d", "no-pivot", "no-new-keyring", "force", "f", "all", "a", "stats", "tty", "t", "no-subreaper", "keep", "ignore-paused", "no-new-privs",
		"leave-running", "tcp-established", "ext-unix-sk", "shell-job", "file-locks", MemoryForkFlag:
		return true
	}
	return false
}

// Main runs one runtime command and returns the process exit status. Errors
// go to the --log file (JSON lines, which the task service reads back for
// its error messages) and to stderr, as runc does.
func Main(args []string) int {
	c, err := parse(args[1:])
	if err == nil {
		err = configureLogging(c.g)
	}
	if err == nil {
		err = run(c)
	}
	if err != nil {
		logrus.Error(err)
		if !logsToStderr() {
			fmt.Fprintln(os.Stderr, err)
		}
		return 1
	}
	return 0
}

func parse(args []string) (*cmdline, error) {
	c := &cmdline{flags: map[string]string{}}
	i, err := c.parseGlobal(args)
	if err != nil {
		return nil, err
	}
	if i >= len(args) {
		return nil, errors.New("no command given")
	}
	c.name = args[i]
	if i, err = c.parseFlags(args, i+1); err != nil {
		return nil, err
	}
	c.args = args[i:]
	if c.g.root == "" {
		c.g.root = "/run/containerd/branch"
	}
	root, err := filepath.Abs(c.g.root)
	if err != nil {
		return nil, err
	}
	if root == "/" {
		return nil, errors.New("option --root argument should not be set to /")
	}
	c.g.root = root
	return c, nil
}

// parseGlobal reads the global flags, up to the command name, and returns
// the command name's index.
func (c *cmdline) parseGlobal(args []string) (int, error) {
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-"); i++ {
		name, val, hasVal := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		needVal := func() (string, error) {
			if hasVal {
				return val, nil
			}
			if i+1 >= len(args) {
				return "", fmt.Errorf("flag --%s needs a value", name)
			}
			i++
			return args[i], nil
		}
		var err error
		switch name {
		case "root":
			c.g.root, err = needVal()
		case "log":
			c.g.log, err = needVal()
		case "log-format":
			c.g.logFormat, err = needVal()
		case "debug":
			c.g.debug = !hasVal || val == "true"
		case "systemd-cgroup":
			c.g.systemd = !hasVal || val == "true"
		case "rootless":
			if !hasVal {
				_, err = needVal()
			}
		default:
			return 0, fmt.Errorf("unknown global flag %q", args[i])
		}
		if err != nil {
			return 0, err
		}
	}
	return i, nil
}

// parseFlags reads the command's flags from args[i:] and returns the index
// of its first positional argument.
func (c *cmdline) parseFlags(args []string, i int) (int, error) {
	// Command flags come before the positional arguments (go-runc's order);
	// "--" or the first non-flag ends them.
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case hasVal:
			c.flags[name] = val
		case boolFlag(name):
			c.flags[name] = "true"
		case i+1 < len(args):
			i++
			c.flags[name] = args[i]
		default:
			return 0, fmt.Errorf("flag %s needs a value", a)
		}
	}
	return i, nil
}

// configureLogging is runc's configLogrus: libcontainer logs through
// logrus's standard logger, and so does containerd/log.
func configureLogging(g globals) error {
	if g.debug {
		logrus.SetLevel(logrus.DebugLevel)
	}
	switch g.logFormat {
	case "", "text":
	case "json":
		logrus.SetFormatter(new(logrus.JSONFormatter))
	default:
		return errors.New("invalid log-format: " + g.logFormat)
	}
	if g.log != "" {
		f, err := os.OpenFile(g.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_SYNC, 0o644)
		if err != nil {
			return fmt.Errorf("open runtime log: %w", err)
		}
		logrus.SetOutput(f)
	}
	return nil
}

func logsToStderr() bool {
	l, ok := logrus.StandardLogger().Out.(*os.File)
	return ok && l.Fd() == os.Stderr.Fd()
}

func run(c *cmdline) error {
	if cmd := oneID(c.name); cmd != nil {
		if len(c.args) != 1 {
			return fmt.Errorf("%q requires exactly %d argument(s), got %d", c.name, 1, len(c.args))
		}
		if c.args[0] == "" {
			return errors.New("container id cannot be empty")
		}
		return cmd(c)
	}
	switch c.name {
	case "exec":
		if len(c.args) < 1 || c.args[0] == "" {
			return errors.New("container id cannot be empty")
		}
		return execProcess(c)
	case "kill":
		if len(c.args) < 1 || len(c.args) > 2 {
			return fmt.Errorf("%q requires 1 or 2 arguments, got %d", c.name, len(c.args))
		}
		return kill(c)
	case "ps":
		if len(c.args) < 1 {
			return errors.New(`"ps" requires a container id`)
		}
		return ps(c)
	case "features":
		return printFeatures()
	default:
		return fmt.Errorf("unsupported runtime command %q", c.name)
	}
}

// oneID is the command name, if it takes exactly one argument, a
// container id; nil if not.
func oneID(name string) func(*cmdline) error {
	switch name {
	case "create":
		return create
	case "start":
		return start
	case "delete":
		return deleteContainer
	case "state":
		return state
	case "pause":
		return pause
	case "resume":
		return resume
	case "update":
		return update
	case "events":
		return events
	case "checkpoint":
		return checkpoint
	case "restore":
		return restore
	}
	return nil
}
