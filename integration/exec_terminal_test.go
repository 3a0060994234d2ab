//go:build linux

package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/client"
)

// TestTerminalExecNoReader: an exec with a terminal whose caller never
// opens its output FIFO (a client gone between making its FIFOs and the
// exec) fails once the call's deadline passes, starting nothing. Before,
// the shim opened that FIFO in the background after starting the process,
// which ran on; the copy of its output waited for a reader for ever, and
// with it the branch's clean-up (its bundle was never removed). The same
// exec with a reader runs, its output read through the terminal.
func TestTerminalExecNoReader(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	kid := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	ctx, tc := shimTTRPC(t, ctx, env, "sb")
	api := shimv1.NewBranchesClient(tc)
	dir := t.TempDir()
	marker := fmt.Sprintf("bbx-term-%d", time.Now().UnixNano())
	exec := func(ctx context.Context, id, out string) error {
		_, err := api.Exec(ctx, &shimv1.ExecRequest{Sandbox: "sb", Branch: kid.ID, ExecId: id, Terminal: true, Stdout: out,
			Args: []string{"sh", "-c", "echo ready; sleep 1000; echo", marker}}) // sh stays, and its $0
		return err
	}

	noReader := filepath.Join(dir, "no-reader")
	if err := unix.Mkfifo(noReader, 0o600); err != nil {
		t.Fatal(err)
	}
	ectx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := exec(ectx, "no-reader", noReader)
	cancel()
	if err == nil {
		t.Fatal("an exec with a terminal whose output FIFO has no reader started")
	}
	t.Logf("exec with no reader: %v", err)
	if pid := withMarker(marker); pid != "" {
		t.Fatalf("the exec that failed left process %s running", pid)
	}

	withReader := filepath.Join(dir, "with-reader")
	if err := unix.Mkfifo(withReader, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenFile(withReader, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := exec(ctx, "with-reader", withReader); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	buf := make([]byte, 256)
	for deadline := time.Now().Add(10 * time.Second); !bytes.Contains(got.Bytes(), []byte("ready")) && time.Now().Before(deadline); {
		n, _ := r.Read(buf)
		got.Write(buf[:max(n, 0)])
		time.Sleep(20 * time.Millisecond)
	}
	if !bytes.Contains(got.Bytes(), []byte("ready")) {
		t.Fatalf("the terminal's output: %q", got.String())
	}
}

// withMarker returns a process of the machine whose command line, its
// arguments joined by spaces, holds marker, or "".
func withMarker(marker string) string {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(bytes.ReplaceAll(b, []byte{0}, []byte{' '}), []byte(marker)) {
			return filepath.Base(filepath.Dir(p))
		}
	}
	return ""
}
