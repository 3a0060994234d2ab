//go:build linux

package cgroup

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
)

// counterEnv makes the test binary a process that writes a counter, one
// more each time, to the file it names, as fast as it can.
const counterEnv = "BBX_CGROUP_TEST_COUNTER"

// TestKillFrozenRunsNoMore: a frozen process that is killed runs no
// instruction of its own again: not a write to a volume, not a packet.
// A commit's winner is frozen while its change is applied and then ended,
// and a frozen sandbox or branch is ended the same way. Thawed before its
// SIGKILL, the counter below went on (both ways of ending, most rounds).
func TestKillFrozenRunsNoMore(t *testing.T) {
	if f := os.Getenv(counterEnv); f != "" {
		countForever(f)
	}
	m := freezerHierarchy(t)
	ctx := context.Background()
	kills := map[string]func(d []Dir) error{
		"KillDirs": func(d []Dir) error { return KillDirs(ctx, d[0].Path, d) },
		"SignalBranch": func(d []Dir) error {
			if err := SignalBranch(ctx, d, true); err != nil {
				return err
			}
			return KillLoop(ctx, d[0].Path, d, d) // the wait; no init's pidfd here
		},
	}
	for name, kill := range kills {
		t.Run(name, func(t *testing.T) {
			for round := 0; round < 10; round++ {
				if before, after := killCounter(t, m, kill); before != after {
					t.Fatalf("round %d: the counter went from %d to %d after the freeze", round, before, after)
				}
			}
		})
	}
}

// killCounter starts a counter in a new cgroup of the hierarchy m, freezes
// it, kills it with kill, and returns the counter frozen and once dead.
func killCounter(t *testing.T, m Dir, kill func([]Dir) error) (frozen, dead uint64) {
	t.Helper()
	d := m
	d.Path = filepath.Join(m.Path, fmt.Sprintf("bbx-kill-test-%d", os.Getpid()))
	if err := os.Mkdir(d.Path, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "counter")
	c := exec.Command(os.Args[0], "-test.run=^TestKillFrozenRunsNoMore$")
	c.Env = append(os.Environ(), counterEnv+"="+file)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = c.Process.Kill()
		_ = SetFreezer(d, d.Path, cgroups.Thawed)
		_ = c.Wait()
		if err := RemoveDirs([]Dir{d}); err != nil {
			t.Error(err)
		}
	}()
	if err := os.WriteFile(filepath.Join(d.Path, "cgroup.procs"), []byte(strconv.Itoa(c.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); read(t, file) < 1000; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the counter did not count to 1000 in 10s: %d", read(t, file))
		}
	}
	if err := SetFreezer(d, d.Path, cgroups.Frozen); err != nil {
		t.Fatal(err)
	}
	frozen = read(t, file)
	if err := kill([]Dir{d}); err != nil {
		t.Fatal(err)
	}
	_ = c.Wait()
	return frozen, read(t, file)
}

// countForever is the counter's process.
func countForever(file string) {
	f, err := os.Create(file)
	if err != nil {
		os.Exit(1)
	}
	var b [8]byte
	for n := uint64(1); ; n++ {
		binary.LittleEndian.PutUint64(b[:], n)
		if _, err := f.WriteAt(b[:], 0); err != nil {
			os.Exit(1)
		}
	}
}

func read(t *testing.T, file string) uint64 {
	b, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return 0 // not started yet
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 8 {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// freezerHierarchy is the hierarchy that freezes (the v1 freezer, or
// cgroup v2 alone), or skips the test.
func freezerHierarchy(t *testing.T) Dir {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups")
	}
	ms, err := Mounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ms {
		if d.Freezer || (d.V2 && len(ms) == 1) {
			return d
		}
	}
	t.Skip("no freezer here (v1 freezer or cgroup2 alone)")
	return Dir{}
}
