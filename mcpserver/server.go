//go:build linux

package mcpserver

import (
	"context"
	"fmt"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/branchbox/branchbox/client"
)

// Config scopes and bounds a server.
type Config struct {
	// Address is containerd's socket; Namespace the one namespace served.
	Address, Namespace string
	// Sandbox, if set, is the one sandbox the tools reach (by id, prefix
	// or name); tools then need no sandbox argument.
	Sandbox string
	// MaxOutput bounds each stream of an exec's output returned, and
	// MaxFile a file read or written, in bytes.
	MaxOutput int
	MaxFile   int64
	// MaxExecs bounds the execs running at once.
	MaxExecs int
	// DefaultTimeout is an exec's timeout when the call gives none;
	// MaxTimeout the most a call may give.
	DefaultTimeout, MaxTimeout time.Duration
	// ProgressEvery is how often a running exec tells a client that asked
	// for progress (a progressToken) that it still runs: a client whose
	// request timeout restarts on progress (the TypeScript SDK's
	// resetTimeoutOnProgress) then waits for a command longer than that
	// timeout (60 s by default there). Default 1 s.
	ProgressEvery time.Duration
	// Version is reported to clients.
	Version string
}

// Server is the MCP server over one containerd namespace.
type Server struct {
	cfg   Config
	cc    *containerd.Client
	execs chan struct{}
	mcp   *mcp.Server

	// stopping ends when the server stops (Stop): the commands still
	// running are killed, as a client gone would have them, and running
	// counts them, and the other tool calls, until they are released.
	stopping context.Context
	stop     context.CancelFunc
	running  sync.WaitGroup
	// stopMu orders a command's count (startCommand) with Stop: none is
	// added once Close may be waiting.
	stopMu sync.Mutex
}

// stopGrace bounds Close's wait for the commands it killed to be
// released, and for the other calls to end.
const stopGrace = 15 * time.Second

// New connects to containerd and makes the server with its tools.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = "default"
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = 64 << 10
	}
	if cfg.MaxFile <= 0 {
		cfg.MaxFile = 1 << 20
	}
	if cfg.MaxExecs <= 0 {
		cfg.MaxExecs = 16
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = 2 * time.Minute
	}
	if cfg.MaxTimeout <= 0 {
		cfg.MaxTimeout = 30 * time.Minute
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = time.Second
	}
	if cfg.Version == "" {
		cfg.Version = "v1"
	}
	cc, err := containerd.New(cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", cfg.Address, err)
	}
	s := &Server{cfg: cfg, cc: cc, execs: make(chan struct{}, cfg.MaxExecs)}
	s.stopping, s.stop = context.WithCancel(context.WithoutCancel(ctx))
	scope := fmt.Sprintf("containerd namespace %q", cfg.Namespace)
	if cfg.Sandbox != "" {
		scope = fmt.Sprintf("sandbox %q in %s", cfg.Sandbox, scope)
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "branchbox", Title: "branchbox", Version: cfg.Version}, &mcp.ServerOptions{
		Instructions: "branchbox sandboxes: fork a running sandbox into copy-on-write branches, run commands and edit files " +
			"in each, commit the branch that worked into its parent (the first commit wins; its siblings become stale) " +
			"and abort the rest. Branch \"0\" is the sandbox itself; it is read-only while it has live branches. " +
			"This server reaches " + scope + ".",
	})
	s.addTools()
	return s, nil
}

// MCP is the server to run on a transport.
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Stop kills the commands that tool calls still run (a server that goes
// away ends them, as a client that goes away does): their calls return
// once each is killed and released.
func (s *Server) Stop() {
	s.stopMu.Lock()
	defer s.stopMu.Unlock()
	s.stop()
}

// startCommand counts a command (or another tool call) as running until
// done is called, or says the server stopped.
func (s *Server) startCommand() (done func(), err error) {
	s.stopMu.Lock()
	defer s.stopMu.Unlock()
	if s.stopping.Err() != nil {
		return nil, fmt.Errorf("the server is stopping: %w", errdefs.ErrUnavailable)
	}
	s.running.Add(1)
	return s.running.Done, nil
}

// Close stops the server, waits a while for its commands' release, and
// closes the connection to containerd.
func (s *Server) Close() error {
	s.Stop()
	released := make(chan struct{})
	go func() {
		s.running.Wait()
		close(released)
	}()
	select {
	case <-released:
	case <-time.After(stopGrace):
	}
	return s.cc.Close()
}

// dial connects to the sandbox a tool call names, within the scope.
func (s *Server) dial(ctx context.Context, name string) (*client.SandboxClient, error) {
	if name == "" {
		name = s.cfg.Sandbox
	}
	if name == "" {
		return nil, fmt.Errorf("name a sandbox (argument sandbox; list_sandboxes lists them): %w", errdefs.ErrInvalidArgument)
	}
	if s.cfg.Sandbox != "" && name != s.cfg.Sandbox {
		want, err := client.ResolveSandbox(ctx, s.cfg.Address, s.cfg.Namespace, s.cfg.Sandbox)
		if err != nil {
			return nil, err
		}
		got, err := client.ResolveSandbox(ctx, s.cfg.Address, s.cfg.Namespace, name)
		if err != nil || got != want {
			return nil, fmt.Errorf("this server reaches only sandbox %q, not %q: %w", s.cfg.Sandbox, name, errdefs.ErrPermissionDenied)
		}
	}
	return client.NewSandboxClient(ctx, s.cfg.Address, s.cfg.Namespace, name)
}
