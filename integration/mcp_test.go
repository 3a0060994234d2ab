//go:build linux

package integration

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/daemons"
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
	srv := exec.Command(ctl, "mcp", "--address", env.Address, "--namespace", env.Namespace, "--sandbox", "mcp-http",
		"--http", "127.0.0.1:0", "--token-file", tokens, "--tls-cert", cert, "--tls-key", key, "--keepalive", "1s")
	var stderr bytes.Buffer
	srv.Stderr = &stderr
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = srv.Process.Signal(os.Interrupt)
		if err := srv.Wait(); err != nil {
			t.Errorf("branchctl mcp --http: %v\n%s", err, stderr.String())
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	if err != nil || !ok || !strings.HasPrefix(url, "https://") {
		t.Fatalf("branchctl mcp --http said %q (%v): %s", line, err, stderr.String())
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
