//go:build linux

package branchctl

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"
)

// Companion is the binary that links the heavy commands, which branchctl
// execs for them.
const Companion = "branchctl-full"

// The heavy commands are the ones whose code links libraries a fork never
// uses and whose package initialisation every start of a binary linking
// them pays, used or not (Go has no lazy imports): serve the HTTP API with
// its OpenTelemetry instrumentation, mcp the MCP SDK and its JSON schemas,
// push, pull, save and load containerd's full client, the registry code
// (distribution/reference's regular expressions) and zstd. Together they
// were half of branchctl's start (docs/benchmarks.md#tails). Their
// definitions (name, usage, flags) are here, in the one table, so that
// branchctl's help, completion and usage errors cover them; their actions
// are in cmd/branchctl-full.
var heavyCommands = []string{"serve", "mcp", "push", "pull", "save", "load"}

// HeavyCommands are the commands whose actions a binary gives Run, or
// leaves to branchctl-full.
func HeavyCommands() []string { return append([]string(nil), heavyCommands...) }

// Env is what a heavy command's action gets: the global flags as read
// where they were given last (globalsOf), and where to print.
type Env struct {
	Address, Namespace string
	JSON               bool
	Stdout, Stderr     io.Writer
}

// Action is a heavy command's action.
type Action func(c *cli.Context, e Env) error

// Actions are heavy commands' actions by command name.
type Actions map[string]Action

// Args returns a command's positional arguments and the command line
// after "--".
func Args(c *cli.Context) (pos, cmd []string) { return split(c) }

// Hosts directory, socket and limits the heavy commands default to: the
// values of client/oci and httpapi, which this package does not link;
// cmd/branchctl-full's TestDefaults holds them to those.
const (
	defaultHostsDir   = "/etc/containerd/certs.d"
	defaultAPISocket  = "/run/branchbox/api.sock"
	defaultMaxBody    = 64 << 20
	defaultMaxExecs   = 16
	defaultKeepAlive  = 10 * time.Second
	defaultMaxStreams = 8
)

// heavy is the action of the heavy command name: its own where this
// binary links it, else branchctl-full's.
func (inv *invocation) heavy(name string) cli.ActionFunc {
	return func(c *cli.Context) error {
		g := globalsOf(c)
		inv.namespace = g.namespace
		if a := inv.actions[name]; a != nil {
			return a(c, Env{Address: g.address, Namespace: g.namespace, JSON: g.json, Stdout: inv.stdout, Stderr: inv.stderr})
		}
		return handoff(inv.args)
	}
}

// handoff runs branchctl-full with this command line in place of this
// process (execve): the same pid, stdio, environment and arguments, so
// that its exit status, its output and the signals sent to it are the
// command's as if branchctl had run it. The command line was parsed here
// first, so that a usage error is reported without it. It returns only
// when branchctl-full cannot be run.
func handoff(args []string) error {
	path, err := companion()
	if err != nil {
		return err
	}
	argv0 := "branchctl"
	if len(os.Args) > 0 {
		argv0 = os.Args[0]
	}
	err = syscall.Exec(path, append([]string{argv0}, args...), os.Environ())
	return fmt.Errorf("run %s: %w", path, err)
}

// companion finds branchctl-full: beside this binary (as make install and
// a release put them; an installed pair stays a pair even when PATH holds
// another branchctl-full), then on PATH.
func companion() (string, error) {
	self, selfErr := os.Executable()
	where := "on PATH"
	if selfErr == nil {
		p := filepath.Join(filepath.Dir(self), Companion)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return notSelf(self, p)
		}
		where = "beside " + self + " nor on PATH"
	}
	p, err := exec.LookPath(Companion)
	if err != nil {
		if !errors.Is(err, exec.ErrNotFound) {
			return "", fmt.Errorf("%s: %v: %w", Companion, err, errdefs.ErrFailedPrecondition)
		}
		return "", fmt.Errorf("this command is in %s, which was not found %s: install it with branchctl (make install puts both in BINDIR): %w", Companion, where, errdefs.ErrFailedPrecondition)
	}
	if selfErr == nil {
		return notSelf(self, p)
	}
	return p, nil
}

// notSelf refuses a branchctl-full that is this very binary (a link to
// branchctl under the companion's name), which would exec itself forever.
func notSelf(self, p string) (string, error) {
	a, errA := os.Stat(self)
	b, errB := os.Stat(p)
	if errA == nil && errB == nil && os.SameFile(a, b) {
		return "", fmt.Errorf("%s is this branchctl itself, not the binary with the heavy commands: %w", p, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

// serveCommand is `branchctl serve`: the HTTP API (httpapi) on a unix
// socket and, with a token file, on TCP. It is a command of branchctl
// rather than a binary of its own because it is the same client with
// another front: the same flags name containerd and the namespace, the
// same error kinds come out, and a node that has branchctl has the API.
func serveCommand(inv *invocation) *cli.Command {
	return &cli.Command{
		Name: "serve", Category: "servers",
		Usage: "serve the sandbox and branch operations over HTTP/JSON (docs/http-api.md)",
		Description: `Listens on a unix socket (--socket) and, given --tcp, on TCP. Over TCP
every request needs a bearer token from --token-file (re-read when it
changes), and TLS (--tls-cert, --tls-key) unless the address is loopback.
Every route is under /v1/namespaces/{ns}/; GET /v1/openapi.json is the
contract.`,
		Flags: withGlobals(
			&cli.StringFlag{Name: "socket", Value: defaultAPISocket, Usage: "unix socket to listen on (\"\": none)"},
			&cli.StringFlag{Name: "tcp", Usage: "also listen on this TCP address (HOST:PORT; port 0 picks one)"},
			&cli.StringFlag{Name: "token-file", Usage: "bearer tokens: lines of TOKEN NAMESPACE... (* for all); required with --tcp"},
			&cli.StringFlag{Name: "tls-cert", Usage: "TLS certificate (PEM) for --tcp"},
			&cli.StringFlag{Name: "tls-key", Usage: "TLS key (PEM) for --tcp"},
			&cli.StringSliceFlag{Name: "serve-namespace", Usage: "serve only this containerd namespace, repeatable (default: any a token allows)"},
			&cli.Int64Flag{Name: "max-body", Value: defaultMaxBody, Usage: "largest request body (a file written), bytes"},
			&cli.IntFlag{Name: "max-execs", Value: defaultMaxExecs, Usage: "concurrent execs per client"},
			&cli.IntFlag{Name: "max-streams", Value: defaultMaxStreams, Usage: "concurrent event streams per client"},
			&cli.DurationFlag{Name: "keepalive", Value: defaultKeepAlive, Usage: "send an exec's or event stream a keep-alive line after this long without one, before a client's or a proxy's idle timeout ends it (0: never)"},
			&cli.StringFlag{Name: "hosts-dir", Value: defaultHostsDir, Usage: "containerd's registry host configuration directory, for push and pull"},
		),
		Action: inv.heavy("serve"),
	}
}

// mcpCommand is `branchctl mcp`: the MCP server (mcpserver), over stdio
// for an agent that starts it as a command, or over streamable HTTP. Like
// serve, it is branchctl with another front: an agent's MCP configuration
// names a command, and this one is on every node that has branchbox.
func mcpCommand(inv *invocation) *cli.Command {
	return &cli.Command{
		Name: "mcp", Category: "servers",
		Usage: "serve the branch operations as MCP tools, over stdio or streamable HTTP (docs/mcp.md)",
		Description: `Scoped to the namespace (--namespace) and, with --sandbox, to one sandbox.
Over stdio (the default) stdout carries the protocol and nothing else.
--http ADDR serves streamable HTTP at /mcp instead; an address that is not
loopback needs --token-file (bearer tokens, as branchctl serve reads them)
and TLS (--tls-cert, --tls-key).`,
		Flags: withGlobals(
			&cli.StringFlag{Name: "sandbox", Usage: "the one sandbox the tools reach (id, prefix or name)"},
			&cli.StringFlag{Name: "http", Usage: "serve streamable HTTP on this address (HOST:PORT; port 0 picks one) instead of stdio"},
			&cli.StringFlag{Name: "token-file", Usage: "with --http: bearer tokens, lines of TOKEN NAMESPACE... (* for all)"},
			&cli.StringFlag{Name: "tls-cert", Usage: "with --http: TLS certificate (PEM)"},
			&cli.StringFlag{Name: "tls-key", Usage: "with --http: TLS key (PEM)"},
			&cli.IntFlag{Name: "max-output", Value: 64 << 10, Usage: "bytes of each of stdout and stderr an exec returns"},
			&cli.Int64Flag{Name: "max-file", Value: 1 << 20, Usage: "bytes of a file read or written"},
			&cli.IntFlag{Name: "max-execs", Value: 16, Usage: "commands running at once"},
			&cli.DurationFlag{Name: "keepalive", Value: defaultKeepAlive, Usage: "with --http: send an event stream a keep-alive comment after this long without a byte, before a client's or a proxy's idle timeout ends a long call (0: never)"},
		),
		Action: inv.heavy("mcp"),
	}
}
