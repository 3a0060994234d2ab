//go:build linux

package cgroup

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// hogEnv makes the test binary a process that touches hogBytes of memory,
// says so and sleeps: killed, its exit takes a while to free them.
const (
	hogEnv   = "BBX_CGROUP_TEST_HOG"
	hogBytes = 256 << 20
)

// TestThawOwnKilledWhileFrozen: processes killed while a branch's own are
// frozen in the seal leaf (a rollback with memory, an abort, a stop) are
// listed in the leaf while their exit frees their memory, cannot be moved
// out, and keep it busy. The thaw waits for them instead of failing with
// "remove seal cgroup ...: device or resource busy" (seen once in
// TestMemoryRollbackSandboxShimKill's set-up).
func TestThawOwnKilledWhileFrozen(t *testing.T) {
	if os.Getenv(hogEnv) != "" {
		mem, err := unix.Mmap(-1, 0, hogBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			os.Exit(1)
		}
		for i := 0; i < len(mem); i += 4096 {
			mem[i] = 1
		}
		fmt.Println("ready")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	m := freezerHierarchy(t)
	ctx := context.Background()
	name := fmt.Sprintf("bbx-thaw-test-%d", os.Getpid())
	dir := filepath.Join(m.Path, name)
	for round := 0; round < 5; round++ {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		var hogs []*exec.Cmd
		cleanup := func() {
			for _, h := range hogs {
				_ = h.Process.Kill()
			}
			_ = ThawOwn(ctx, name)
			for _, h := range hogs {
				_ = h.Wait()
			}
			// Whatever the thaw left, once the processes are gone.
			_ = unix.Rmdir(filepath.Join(dir, SealLeaf))
			_ = unix.Rmdir(filepath.Join(dir, OwnLeaf))
			if err := unix.Rmdir(dir); err != nil && !os.IsNotExist(err) {
				t.Errorf("remove test cgroup %s: %v", dir, err)
			}
		}
		for i := 0; i < 4; i++ {
			h := exec.Command(os.Args[0], "-test.run=^TestThawOwnKilledWhileFrozen$")
			h.Env = append(os.Environ(), hogEnv+"=1")
			out, err := h.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Start(); err != nil {
				t.Fatal(err)
			}
			hogs = append(hogs, h)
			if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
				cleanup()
				t.Fatalf("memory hog said %q", line)
			}
			if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(h.Process.Pid)), 0); err != nil {
				cleanup()
				t.Fatal(err)
			}
		}
		if err := FreezeOwn(ctx, name); err != nil {
			cleanup()
			t.Fatal(err)
		}
		for _, h := range hogs {
			_ = h.Process.Kill()
		}
		err := ThawOwn(ctx, name)
		if _, serr := os.Stat(filepath.Join(dir, SealLeaf)); err != nil || serr == nil {
			cleanup()
			t.Fatalf("round %d: thaw of frozen processes killed meanwhile: %v (seal leaf left: %v)", round, err, serr == nil)
		}
		cleanup()
	}
}
