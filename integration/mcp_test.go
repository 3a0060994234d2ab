//go:build linux

package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/fifoio"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// ctrSandbox runs a sandbox with ctr, and removes it when the test ends.
func ctrSandbox(t *testing.T, ctx context.Context, env *daemons.Env, id string) {
	t.Helper()
	// At most 3 checkpoints: the session reaches the bound.
	if _, err := env.Ctr(ctx, "run", "-d", "--snapshotter", "branch", "--runtime", branchRuntime, "--annotation", "io.branchbox.max-checkpoints=3", ociimage.ImageRef, id, "sleep", "100000"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if _, err := env.Ctr(ctx, "task", "rm", "-f", id); err != nil {
			t.Errorf("remove task %s: %v", id, err)
		}
		if _, err := env.Ctr(ctx, "container", "rm", id); err != nil {
			t.Errorf("remove container %s: %v", id, err)
		}
	})
}

// TestMCPServer drives `branchctl mcp` through a whole session (tools and
// their schemas, fork, files, exec, checkpoint, rollback, commit with the
// sibling stale, abort, tree, and errors that say what to do) with the
// official MCP TypeScript SDK as the client: over stdio (scoped to one
// sandbox, and to the namespace), and over streamable HTTP with TLS and a
// bearer token.
func TestMCPServer(t *testing.T) {
	requireNodeModules(t)
	ctx, env := startEnv(t)
	importImage(t, ctx, env, "branch")
	ctl := filepath.Join(env.BinDir, "branchctl")
	session := func(mode string, extra ...string) {
		t.Helper()
		start := time.Now()
		cmd := exec.CommandContext(ctx, "node", "mcp-session.mjs", mode)
		cmd.Dir = "node"
		cmd.Env = append(os.Environ(), extra...)
		out, err := cmd.CombinedOutput()
		t.Logf("mcp session over %s (%s):\n%s", mode, time.Since(start).Round(time.Millisecond), out)
		if err != nil {
			t.Fatalf("mcp session over %s: %v", mode, err)
		}
	}

	ctrSandbox(t, ctx, env, "mcp-stdio")
	session("stdio", "BRANCHBOX_CTL="+ctl, "BRANCHBOX_ADDRESS="+env.Address, "BRANCHBOX_NAMESPACE="+env.Namespace, "BRANCHBOX_SANDBOX=mcp-stdio")

	// Scoped to the namespace, the tools name their sandbox.
	session("ns", "BRANCHBOX_CTL="+ctl, "BRANCHBOX_ADDRESS="+env.Address, "BRANCHBOX_NAMESPACE="+env.Namespace, "BRANCHBOX_SANDBOX=mcp-stdio")

	ctrSandbox(t, ctx, env, "mcp-http")
	const tok = "mcp-test-token-0123456789abcdef"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(tok+" "+env.Namespace+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, key, _ := selfSigned(t, t.TempDir())
	srv := startMCPHTTP(t, ctl, "--address", env.Address, "--namespace", env.Namespace, "--sandbox", "mcp-http",
		"--token-file", tokens, "--tls-cert", cert, "--tls-key", key, "--keepalive", "1s")
	defer func() {
		if err := srv.stop(os.Interrupt); err != nil {
			t.Errorf("branchctl mcp --http: %v\n%s", err, srv.stderr.String())
		}
	}()
	url := srv.url
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("branchctl mcp --http with TLS serves %s", url)
	}
	// Without the token, the endpoint refuses.
	// node trusts the test's CA through NODE_EXTRA_CA_CERTS.
	if out, err := nodeIn("node", exec.CommandContext(ctx, "node", "mcp-session.mjs", "http"), "MCP_URL="+url, "NODE_EXTRA_CA_CERTS="+cert).CombinedOutput(); err == nil {
		t.Fatalf("an MCP session without a token succeeded:\n%s", out)
	}
	// MCP_IDLE_MS: a call silent for 5 s through a proxy that cuts a
	// response idle for 2.5 s, kept open by the keep-alive comments.
	session("http", "MCP_URL="+url, "MCP_TOKEN="+tok, "NODE_EXTRA_CA_CERTS="+cert, "MCP_IDLE_MS=2500")

	// Off loopback, tokens and TLS are required.
	for _, args := range [][]string{{}, {"--token-file", tokens}} {
		out, err := exec.CommandContext(ctx, ctl, append([]string{"mcp", "--address", env.Address, "--namespace", env.Namespace, "--http", "0.0.0.0:0"}, args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "not a loopback address") {
			t.Fatalf("mcp --http 0.0.0.0:0 %v: %v: %s", args, err, out)
		}
	}
}

func nodeIn(dir string, cmd *exec.Cmd, env ...string) *exec.Cmd {
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// TestMCPServerStopKills: a server stopped (SIGTERM) while a call runs a
// command kills the command, answers the call with the reason, releases
// the exec and exits. It exited after 5 s with the command left running
// in the branch and its FIFOs behind.
func TestMCPServerStopKills(t *testing.T) {
	requireNodeModules(t)
	ctx, env := startEnv(t)
	importImage(t, ctx, env, "branch")
	ctrSandbox(t, ctx, env, "mcp-stop")
	before := fifoDirs()
	srv := startMCPHTTP(t, filepath.Join(env.BinDir, "branchctl"), "--address", env.Address, "--namespace", env.Namespace, "--sandbox", "mcp-stop")
	defer func() { _ = srv.stop(syscall.SIGKILL) }()
	url := srv.url
	var out bytes.Buffer
	call := nodeIn("node", exec.CommandContext(ctx, "node", "mcp-stop.mjs"), "MCP_URL="+url)
	call.Stdout, call.Stderr = &out, &out
	if err := call.Start(); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() { answered <- call.Wait() }()
	running := func() bool { return hostProcsWith(env.Namespace, "mcp-stop", "sleep 779") > 0 }
	waitUntil(t, "the call's command", 30*time.Second, running)
	if err := srv.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("branchctl mcp after SIGTERM: %v\n%s", err, srv.stderr.String())
	}
	if err := <-answered; err != nil || !strings.Contains(out.String(), "the server stopped") {
		t.Fatalf("the call's answer (%v):\n%s", err, out.String())
	}
	if running() {
		t.Fatal("the call's command runs on after its server stopped")
	}
	if after := fifoDirs(); !slices.Equal(after, before) {
		t.Fatalf("exec FIFOs before %v, after %v", before, after)
	}
}

// mcpServer is `branchctl mcp --http 127.0.0.1:0`, started.
type mcpServer struct {
	url    string
	cmd    *exec.Cmd
	stderr bytes.Buffer
	exited chan error // its Wait's answer
	once   sync.Once
	err    error
}

// startMCPHTTP starts ctl's MCP server over streamable HTTP with args and
// reads the URL it serves.
func startMCPHTTP(t *testing.T, ctl string, args ...string) *mcpServer {
	t.Helper()
	m := &mcpServer{cmd: exec.Command(ctl, append([]string{"mcp", "--http", "127.0.0.1:0"}, args...)...), exited: make(chan error, 1)}
	m.cmd.Stderr = &m.stderr
	stdout, err := m.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	go func() { m.exited <- m.cmd.Wait() }()
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	if err != nil || !ok {
		_ = m.stop(syscall.SIGKILL)
		t.Fatalf("branchctl mcp --http said %q (%v): %s", line, err, m.stderr.String())
	}
	m.url = url
	return m
}

// stop signals the server and waits for it to exit, 20 s at most (then
// it is killed); it says how it exited. Once: later calls say the same.
func (m *mcpServer) stop(sig os.Signal) error {
	m.once.Do(func() {
		_ = m.cmd.Process.Signal(sig)
		select {
		case m.err = <-m.exited:
		case <-time.After(20 * time.Second):
			_ = m.cmd.Process.Kill()
			<-m.exited
			m.err = fmt.Errorf("still running 20 s after %v", sig)
		}
	})
	return m.err
}

// fifoDirs lists the FIFO directories of execs (internal/fifoio).
func fifoDirs() []string {
	entries, _ := os.ReadDir(fifoio.Dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
