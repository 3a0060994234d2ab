//go:build linux

package sandbox

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/procfd"
	"github.com/branchbox/branchbox/shim/cgroup"
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

// TestMemoryRoom: a memory fork's copies are checked against the memory
// limits of the parent's cgroup and of those above it, v1 and v2, the
// binding one named; a limit per branch is checked against one copy.
func TestMemoryRoom(t *testing.T) {
	write := func(dir string, files map[string]string) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f, v := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	const mib = 1 << 20
	root := t.TempDir()
	v1 := filepath.Join(root, "memory")
	write(v1, map[string]string{"memory.limit_in_bytes": "9223372036854771712\n", "memory.stat": "total_rss 900\n"})
	write(filepath.Join(v1, "pod"), map[string]string{"memory.limit_in_bytes": "209715200\n", "memory.stat": "cache 5\ntotal_rss 52428800\n"})
	write(filepath.Join(v1, "pod", "sb"), map[string]string{"memory.limit_in_bytes": "104857600\n", "memory.stat": "total_cache 1\ntotal_rss 41943040\n"})
	write(filepath.Join(v1, "pod", "free"), map[string]string{"memory.limit_in_bytes": "9223372036854771712\n", "memory.stat": "total_rss 41943040\n"})
	ms := []cgroup.Dir{{Path: filepath.Join(root, "cpu")}, {Path: v1, Memory: true}, {Path: filepath.Join(root, "unified"), V2: true}}
	levels := func(ms []cgroup.Dir, path string) string {
		var out []string
		for _, l := range cgroup.MemoryLimits(ms, path) {
			out = append(out, fmt.Sprintf("%s:%d/%d", l.Cgroup, l.Room()/mib, l.Limit/mib))
		}
		return strings.Join(out, " ")
	}
	if got := levels(ms, "/pod/sb"); got != "/pod/sb:60/100 /pod:150/200" {
		t.Errorf("v1, the sandbox's limit and the pod's: %q", got)
	}
	if got := levels(ms, "/pod/free"); got != "/pod:150/200" {
		t.Errorf("v1, the pod's limit alone: %q", got)
	}
	v2 := filepath.Join(root, "v2")
	write(filepath.Join(v2, "pod", "sb"), map[string]string{"memory.max": "max\n", "memory.stat": "anon 41943040\nfile 7\n"})
	write(filepath.Join(v2, "pod"), map[string]string{"memory.max": "104857600\n", "memory.stat": "anon 41943040\n"})
	if got := levels([]cgroup.Dir{{Path: v2, V2: true}}, "/pod/sb"); got != "/pod:60/100" {
		t.Errorf("v2, the pod's limit: %q", got)
	}
	if got := levels([]cgroup.Dir{{Path: filepath.Join(root, "none"), V2: true}}, "/pod/sb"); got != "" {
		t.Errorf("no memory files: limits %q", got)
	}

	if err := checkMemoryRoom(ms, "/pod/sb", "the sandbox", 20*mib, 3, 0, "memory fork of sb"); err != nil {
		t.Errorf("3 copies of 20 MiB in 60 MiB: %v", err)
	}
	err := checkMemoryRoom(ms, "/pod/sb", "the sandbox", 40*mib, 2, 0, "memory fork of sb")
	want := "memory fork of sb: 2 copies of its processes' memory (about 40MiB each) would need 80MiB, and the memory limit of the sandbox's cgroup leaves 60MiB of its 100MiB: fork fewer branches, or raise the limit: resource exhausted"
	if err == nil || err.Error() != want || !errdefs.IsResourceExhausted(err) {
		t.Errorf("2 copies of 40 MiB in 60 MiB:\n%v\nwant\n%s", err, want)
	}
	if err := checkMemoryRoom(ms, "/pod/free", "the sandbox", 40*mib, 4, 0, "memory fork of sb"); err == nil || !strings.Contains(err.Error(), "the memory limit of a cgroup above the sandbox's leaves 150MiB of its 200MiB") {
		t.Errorf("4 copies of 40 MiB in the pod's 150 MiB: %v", err)
	}
	if err := checkMemoryRoom(ms, "/pod/sb", "the sandbox", 20*mib, 1, 16*mib, "memory fork of sb"); err == nil || !strings.Contains(err.Error(), "more than the 16MiB memory limit asked for each branch") {
		t.Errorf("20 MiB under a limit of 16 MiB a branch: %v", err)
	}
}
