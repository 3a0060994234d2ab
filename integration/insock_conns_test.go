//go:build linux

package integration

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/daemons"
)

// connHogEnv makes the test binary a process that opens connections to a
// branch socket and holds them (TestInsockConnBounds).
const connHogEnv = "BBX_TEST_CONN_HOG"

// connHog dials path n times (retrying while the listener's backlog is
// full), waits for the shim to answer or hang up, prints how many are
// still open, and holds them until its stdin closes.
func connHog(path string, n int) {
	time.Sleep(100 * time.Millisecond)
	var conns []net.Conn
	for len(conns) < n {
		c, err := net.Dial("unix", path)
		if errors.Is(err, syscall.EAGAIN) {
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			fmt.Println("dial:", err)
			os.Exit(1)
		}
		conns = append(conns, c)
	}
	time.Sleep(time.Second)
	open := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
			open++
		}
	}
	fmt.Println(open)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	os.Exit(0)
}

// TestInsockConnBounds: a process in a sandbox opening connections to its
// branch socket and holding them finds at most 512 open at once (each
// costs the shim about 15 KB outside the sandbox's limits: before, 5,206
// opened in a second took the shim from 24 to 102 MB); while it holds
// them, branchctl self in the sandbox says why it is refused; once they
// close, it works again.
func TestInsockConnBounds(t *testing.T) {
	if v := os.Getenv(connHogEnv); v != "" {
		path, n, _ := strings.Cut(v, ",")
		count, _ := strconv.Atoi(n)
		connHog(path, count)
	}
	ctx, env, _ := shimEnvWith(t, daemons.Config{})
	importInsockImage(t, ctx, env)
	runBoundedSandbox(t, ctx, env, "sb")
	sock := filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, "sb", "selfsock", "branch.sock")

	// The hog runs on the host, moved into the sandbox's cgroups: the
	// socket takes its peers by their cgroup.
	hog := exec.Command(os.Args[0], "-test.run=^TestInsockConnBounds$")
	hog.Env = append(os.Environ(), connHogEnv+"="+sock+",1000")
	stdin, err := hog.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := hog.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	hog.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = hog.Wait()
	})
	// It sleeps a moment before it dials; stopped meanwhile, it is moved.
	_ = syscall.Kill(hog.Process.Pid, syscall.SIGSTOP)
	for _, dir := range containerCgroupDirs(env.Namespace, "sb") {
		_ = os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(hog.Process.Pid)), 0)
	}
	_ = syscall.Kill(hog.Process.Pid, syscall.SIGCONT)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	open, cerr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || cerr != nil {
		t.Fatalf("the connection hog said %q (%v)", line, err)
	}
	t.Logf("%d of 1000 connections open", open)
	if open > 512 || open < 256 {
		t.Fatalf("%d of 1000 connections to the branch socket stayed open, want at most 512 (and some)", open)
	}
	_, err = env.Ctr(ctx, "task", "exec", "--exec-id", "refused", "sb", "branchctl", "self", "tree")
	if err == nil || !strings.Contains(err.Error(), "its maximum of connections open to its branch sockets") {
		t.Fatalf("branchctl self tree while the sandbox holds its maximum of connections: %v", err)
	}
	stdin.Close()
	if err := hog.Wait(); err != nil {
		t.Fatalf("connection hog: %v", err)
	}
	waitUntil(t, "branchctl self tree once the connections closed", 10*time.Second, func() bool {
		_, err := execIn(ctx, env, "sb", "branchctl", "self", "tree")
		return err == nil
	})
}
