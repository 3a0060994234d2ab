//go:build linux

package sandbox

import (
	"io"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/procfd"
)

// TestAnonymousBytes: the estimate of a process's memory image counts the
// anonymous memory it wrote (this test's own 32 MiB).
func TestAnonymousBytes(t *testing.T) {
	before := anonymousBytes(os.Getpid())
	buf := make([]byte, 32<<20)
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 1
	}
	after := anonymousBytes(os.Getpid())
	if after-before < 30<<20 {
		t.Fatalf("anonymous memory %d before and %d after writing 32 MiB", before, after)
	}
	if anonymousBytes(-1) != 0 {
		t.Fatal("a process that does not exist holds memory")
	}
	_ = buf[len(buf)-1]
}

// TestAnonymousBytesShared: pages a parent and its forked child share
// copy-on-write count once over the two (Pss_Anon), not once each: a
// pre-forked server's image is not overestimated N times.
func TestAnonymousBytesShared(t *testing.T) {
	// A Python that writes 64 MiB, then forks a child that only sleeps:
	// the child shares the parent's pages until either writes them.
	cmd := exec.Command("python3", "-c", `
import os, sys, time
b = bytearray(64 << 20)
for i in range(0, len(b), 4096): b[i] = 1
if os.fork() == 0:
    time.sleep(60); os._exit(0)
print("forked", flush=True)
time.sleep(60)
`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("python3: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line := make([]byte, 7)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "forked\n" {
		t.Fatalf("python3 did not fork: %q %v", line, err)
	}
	var sum int64
	tree := procfd.Tree(cmd.Process.Pid, nil)
	for pid := range tree {
		sum += anonymousBytes(pid)
	}
	for pid := range tree {
		if pid != cmd.Process.Pid {
			defer unix.Kill(pid, unix.SIGKILL)
		}
	}
	if len(tree) != 2 || sum < 60<<20 || sum > 100<<20 {
		t.Fatalf("%d processes sharing 64 MiB count %d bytes, want about 64 MiB once", len(tree), sum)
	}
}
