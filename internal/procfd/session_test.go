//go:build linux

package procfd

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseStat(t *testing.T) {
	for _, c := range []struct {
		line string
		want Stat
		bad  bool
	}{
		{line: "42 (sleep) S 1 42 42 0 -1 4194560", want: Stat{'S', 1, 42, 4194560}},
		{line: "7 (a b) (c)) R 1 3 5 0 -1 4", want: Stat{'R', 1, 5, 4}},
		{line: "7 (x) R 9 (y) S 1 3 5 0 -1 0", want: Stat{'S', 1, 5, 0}},
		{line: "7 (x) R 1 3 5 0", bad: true},
		{line: "7 (x) R 1 3 z 0 -1 0", bad: true},
		{line: "garbage", bad: true},
	} {
		got, err := parseStat([]byte(c.line))
		if c.bad != (err != nil) || (!c.bad && got != c.want) {
			t.Errorf("parseStat(%q) = %+v, %v; want %+v (fails: %v)", c.line, got, err, c.want, c.bad)
		}
	}
}

// A shell leading a session of its own, with a child in it and a
// child that made a session of its own: the signal reaches the shell
// and its child, not the other, nor this process (another session).
func TestSignalSession(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", "sleep 60 & echo $! > "+dir+"/in; setsid sleep 60 & echo $! > "+dir+"/out; wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	leader := cmd.Process.Pid
	read := func(name string) int {
		for deadline := time.Now().Add(10 * time.Second); ; {
			b, _ := os.ReadFile(dir + "/" + name)
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return pid
			}
			if time.Now().After(deadline) {
				t.Fatalf("no pid in %s", name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	in, out := read("in"), read("out")
	defer func() {
		_ = unix.Kill(out, unix.SIGKILL)
		_ = unix.Kill(in, unix.SIGKILL)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	// setsid forks when it leads a process group already: wait for the
	// sleep to be in its new session.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if s, err := Session(out); err == nil && s != leader {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the setsid child is still in the shell's session")
		}
		time.Sleep(10 * time.Millisecond)
	}
	n, err := SignalSession([]int{os.Getpid(), leader, in, out, 1 << 30}, leader, unix.SIGKILL)
	if err != nil || n != 2 {
		t.Fatalf("SignalSession: %d signalled, %v; want 2 (the shell and its child)", n, err)
	}
	_ = cmd.Wait()
	if unix.Kill(out, 0) != nil {
		t.Fatal("the child in a session of its own was signalled")
	}
	for deadline := time.Now().Add(10 * time.Second); unix.Kill(in, 0) == nil; {
		// The child is reparented (to init or a subreaper) and reaped
		// there; until then it is a zombie.
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(in) + "/stat"); strings.Contains(string(b), ") Z") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the shell's child lives on")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
