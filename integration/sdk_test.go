//go:build linux

package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/ociimage"
)

// sdkTimeout bounds an SDK's test run: one that hangs fails, saying where.
const sdkTimeout = 3 * time.Minute

// sdkEnv starts daemons and `branchctl serve` (unix socket, and TCP with
// TLS and a token) for an SDK's own tests, and returns the environment
// they read.
func sdkEnv(t *testing.T) ([]string, *served) {
	t.Helper()
	ctx, env := startEnv(t)
	importImage(t, ctx, env, "branch")
	const tok = "sdk-test-token-0123456789abcdef"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(tok+" "+env.Namespace+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// TCP with TLS, as a remote client would reach it; keep-alive lines
	// after 1 s without output (test_silent_command_under_a_read_timeout).
	cert, key, _ := selfSigned(t, t.TempDir())
	srv := startServe(t, env, true, "--token-file", tokens, "--tls-cert", cert, "--tls-key", key, "--keepalive", "1s")
	// What an SDK's test left behind, if it failed halfway.
	removeSandboxesAtEnd(t, srv, env.Namespace)
	return append(os.Environ(), "BRANCHBOX_SOCKET="+srv.Socket, "BRANCHBOX_URL="+srv.TCP, "BRANCHBOX_TOKEN="+tok, "BRANCHBOX_CA="+cert,
		"BRANCHBOX_NAMESPACE="+env.Namespace, "BRANCHBOX_IMAGE="+ociimage.ImageRef), srv
}

// TestPythonSDK runs the Python SDK's tests (sdk/python/tests), the
// best-of-N example among them, under Debian's python3 against real
// daemons.
func TestPythonSDK(t *testing.T) {
	environ, srv := sdkEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), sdkTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", "-X", "faulthandler", "-m", "unittest", "-v", "tests/test_sdk.py")
	// On the timeout, the server and python say where they wait (the
	// server's goroutines, python's faulthandler), then go.
	cmd.Cancel = func() error {
		srv.quit()
		return cmd.Process.Signal(syscall.SIGABRT)
	}
	cmd.WaitDelay = 10 * time.Second
	cmd.Dir = "../sdk/python"
	cmd.Env = append(environ, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
}

// nodeModules is where make installs the pinned npm packages the tests
// use (integration/node/package-lock.json).
const nodeModules = "node/node_modules"

func requireNodeModules(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(nodeModules, ".package-lock.json")); err != nil {
		t.Fatalf("the test's npm packages are not installed (make node-deps, which make test runs): %v", err)
	}
}

// TestTypeScriptSDK type-checks the TypeScript SDK's declarations with the
// example and tests that use them (tsc, pinned), then runs its tests, the
// best-of-N example among them, under the machine's node against real
// daemons.
func TestTypeScriptSDK(t *testing.T) {
	requireNodeModules(t)
	tsc := exec.Command(filepath.Join(nodeModules, ".bin", "tsc"), "-p", "../sdk/typescript/tsconfig.json")
	if out, err := tsc.CombinedOutput(); err != nil {
		t.Fatalf("tsc: %v\n%s", err, out)
	}
	environ, srv := sdkEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), sdkTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-reporter=spec", "test/")
	cmd.Cancel = func() error {
		srv.quit()
		return cmd.Process.Kill()
	}
	cmd.WaitDelay = 10 * time.Second
	cmd.Dir = "../sdk/typescript"
	cmd.Env = environ
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
}
