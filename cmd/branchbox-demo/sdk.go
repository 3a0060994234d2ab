//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// pythonExample is the Python SDK's best-of-N, relative to the repository
// (make demo runs from it).
const pythonExample = "sdk/python/examples/best_of_n.py"

// runSDK does best-of-N again, as an agent in Python would: through
// `branchctl serve` and the Python SDK, on a sandbox of its own.
func runSDK(ctx context.Context, env *daemons.Env, bin string, timed timer) error {
	if _, err := os.Stat(pythonExample); err != nil {
		fmt.Printf("  (no %s here: run the demo from the repository to see the Python SDK)\n", pythonExample)
		return nil
	}
	sock := filepath.Join(env.Dir, "api.sock")
	srv := exec.CommandContext(ctx, filepath.Join(bin, "branchctl"), "serve", "--address", env.Address, "--socket", sock)
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() {
		_ = srv.Process.Signal(os.Interrupt)
		_ = srv.Wait()
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("branchctl serve did not make its socket")
		}
	}
	fmt.Printf("  branchctl serve on %s; python3 %s:\n", sock, pythonExample)
	return timed("Python SDK: make a sandbox, fork 4, test each, commit the first", func() error {
		out, err := exec.CommandContext(ctx, "/usr/bin/python3", pythonExample, "--socket", sock,
			"--namespace", env.Namespace, "--image", ociimage.ImageRef, "--sandbox", "agent-py").CombinedOutput()
		fmt.Print(indent(string(out)))
		return err
	})
}
