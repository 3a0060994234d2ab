//go:build linux

package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/procfd"
)

// TestAlive: a running process is alive, and so is one whose command name
// holds ") " (the stat line is cut after the last one); a killed one is
// not, on its way out or a zombie.
func TestAlive(t *testing.T) {
	// A command name with ") x" in it: a copy of sleep named so.
	odd := filepath.Join(t.TempDir(), "a) b")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep")
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(odd, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(odd, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if !alive(cmd.Process.Pid) {
		t.Fatalf("running process %d (named %q) not alive", cmd.Process.Pid, filepath.Base(odd))
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not waited for: a zombie until Wait.
	deadline := time.Now().Add(5 * time.Second)
	for alive(cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatalf("killed process %d still alive after 5s", cmd.Process.Pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Not alive from the moment it is on its way out (PF_EXITING, its
	// state still R), then a zombie.
	if st, err := procfd.ReadStat(cmd.Process.Pid); err != nil || (st.State != 'Z' && st.Flags&procfd.Exiting == 0) {
		t.Fatalf("killed, not waited for: state %q flags %#x (%v), want a zombie or one exiting", st.State, st.Flags, err)
	}
}
