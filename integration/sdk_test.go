//go:build linux

package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/branchbox/branchbox/internal/ociimage"
)

// sdkEnv starts daemons and `branchctl serve` (unix socket and TCP with a
// token) for an SDK's own tests, and returns the environment they read.
func sdkEnv(t *testing.T) []string {
	t.Helper()
	ctx, env := startEnv(t)
	importImage(t, ctx, env, "branch")
	const tok = "sdk-test-token-0123456789abcdef"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(tok+" "+env.Namespace+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startServe(t, env, true, "--token-file", tokens)
	return append(os.Environ(), "BRANCHBOX_SOCKET="+srv.Socket, "BRANCHBOX_URL="+srv.TCP, "BRANCHBOX_TOKEN="+tok,
		"BRANCHBOX_NAMESPACE="+env.Namespace, "BRANCHBOX_IMAGE="+ociimage.ImageRef)
}

// TestPythonSDK runs the Python SDK's tests (sdk/python/tests), the
// best-of-N example among them, under Debian's python3 against real
// daemons.
func TestPythonSDK(t *testing.T) {
	environ := sdkEnv(t)
	cmd := exec.Command("/usr/bin/python3", "-m", "unittest", "-v", "tests/test_sdk.py")
	cmd.Dir = "../sdk/python"
	cmd.Env = append(environ, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
}
