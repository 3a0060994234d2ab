//go:build linux

package integration

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHTTPAPIExecSession: an exec's timeout, or its client leaving, ends
// what the exec started too, not the exec alone: a shell's command, and
// a process it put in the background that holds the exec's output open
// (whose wait would otherwise never end: the timeout's answer did not
// come, and the process ran on in the branch). Both in a branch and in
// the sandbox's own task (branch 0, an exec of its containerd task).
func TestHTTPAPIExecSession(t *testing.T) {
	ctx, env, srv, api, sb := apiSandbox(t)
	api.must(ctx, 200, "POST", sb+"/fork", map[string]any{"count": 1})

	// gone waits until no live process of the sandbox runs cmd.
	gone := func(what, cmd string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var left []hostProc
			for _, p := range containerHostProcs(env.Namespace, "sb", 0) {
				if strings.TrimSpace(p.cmd) == cmd {
					left = append(left, p)
				}
			}
			if len(left) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %q still runs: %+v", what, cmd, left)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, br := range []string{"1", "0"} {
		exec := sb + "/branches/" + br + "/exec"
		what := "branch " + br

		// A background process holding the output: the exec's own
		// process exits at once, and the timeout ends the wait for
		// the output by killing what holds it.
		// (A deadline of the test's own: without the fix the answer
		// never came.)
		start := time.Now()
		ectx, ecancel := context.WithTimeout(ctx, 30*time.Second)
		r := api.must(ectx, 200, "POST", exec, map[string]any{"args": []string{"sh", "-c", "sleep 3001 & echo bg"}, "timeout": 1})
		ecancel()
		stdout, _, exit, kind := execOut(r.Lines)
		if stdout != "bg\n" || exit == nil || kind != "deadline-exceeded" {
			t.Fatalf("%s: background process and a timeout: %s after %s", what, r.Body, time.Since(start))
		}
		gone(what+", background process past the timeout", "sleep 3001")

		// A shell's command, its child, killed with it.
		r = api.must(ctx, 200, "POST", exec, map[string]any{"args": []string{"sh", "-c", "sleep 3002; echo not reached"}, "timeout": 0.5})
		if stdout, _, exit, kind = execOut(r.Lines); stdout != "" || exit == nil || exit["exitCode"] != float64(137) || kind != "deadline-exceeded" {
			t.Fatalf("%s: a shell's child and a timeout: %s", what, r.Body)
		}
		gone(what+", a shell's child past the timeout", "sleep 3002")

		// A client that leaves mid-stream.
		cctx, cancel := context.WithCancel(ctx)
		req := `{"args": ["sh", "-c", "echo started; sleep 3003; echo not reached"]}`
		hreq, err := http.NewRequestWithContext(cctx, "POST", "http://branchbox"+exec, strings.NewReader(req))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		resp, err := unixHTTP(srv.Socket).Do(hreq)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || !strings.Contains(line, "started") {
			cancel()
			t.Fatalf("%s: first line %q, %v", what, line, err)
		}
		cancel()
		resp.Body.Close()
		gone(what+", its client gone", "sleep 3003")
	}
}

// TestHTTPAPIExecContainerdRestart: an exec runs on across a restart of
// containerd, and its answer is its exit status, in a branch (the shim's)
// and in the sandbox's own task (branch 0, an exec of its containerd
// task, whose wait through containerd broke: the answer was an
// Unavailable error after the output).
func TestHTTPAPIExecContainerdRestart(t *testing.T) {
	ctx, env, _, api, sb := apiSandbox(t)
	api.must(ctx, 200, "POST", sb+"/fork", map[string]any{"count": 1})
	type answer struct {
		br string
		r  apiResult
	}
	answers := make(chan answer, 2)
	for _, br := range []string{"1", "0"} {
		go func() {
			// Sent even if do fails the test (t.Fatal ends this
			// goroutine): the test reads two answers.
			var r apiResult
			defer func() { answers <- answer{br, r} }()
			// A deadline of the test's own: an answer that never came
			// would hang it.
			ectx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			r = api.do(ectx, "POST", sb+"/branches/"+br+"/exec", map[string]any{"args": []string{"sh", "-c", "echo started; while [ ! -e /dev/shm/go-on ]; do sleep 0.05; done; echo done; exit 3"}}, false)
		}()
	}
	// Both run, then containerd goes and comes back, then they end.
	waitUntil(t, "both execs", 20*time.Second, func() bool { return hostProcsWith(env.Namespace, "sb", "go-on") == 2 })
	if err := env.StopContainerd(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the waits see it gone
	if err := env.StartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	for _, br := range []string{"1", "0"} {
		api.must(ctx, 200, "POST", sb+"/branches/"+br+"/exec", map[string]any{"args": []string{"touch", "/dev/shm/go-on"}})
	}
	for range 2 {
		a := <-answers
		stdout, _, exit, kind := execOut(a.r.Lines)
		if a.r.Status != 200 || stdout != "started\ndone\n" || kind != "" || exit == nil || exit["exitCode"] != float64(3) {
			t.Fatalf("branch %s: exec across containerd's restart: %d %s", a.br, a.r.Status, a.r.Body)
		}
	}
}

// An exec of the sandbox's task whose client leaves while containerd is
// away (a restart) is killed all the same, at once, and deleted once
// containerd is back: its FIFOs are released. containerd's calls wait for
// it to come back; the kill waited with them, up to its 10 s, and then
// gave up: the command ran on, and nothing deleted the exec.
func TestHTTPAPIExecAbandonedContainerdAway(t *testing.T) {
	ctx, env, _, api, sb := apiSandbox(t)
	before := fifoDirs()
	ectx, leave := context.WithCancel(ctx)
	answered, started := make(chan struct{}), make(chan string, 1)
	go func() {
		defer close(answered)
		// Not api.do, which fails the test when its request fails.
		req, err := http.NewRequestWithContext(ectx, "POST", api.base+sb+"/branches/0/exec", strings.NewReader(`{"args": ["sh", "-c", "echo started; exec sleep 4321"]}`))
		if err != nil {
			started <- err.Error()
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := api.hc.Do(req)
		if err != nil {
			started <- err.Error()
			return
		}
		defer resp.Body.Close()
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		started <- line
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
	// The server waits for the exec once its output streams.
	if line := <-started; !strings.Contains(line, "started") {
		t.Fatalf("the exec's first line: %q", line)
	}
	running := func() bool { return hostProcsWith(env.Namespace, "sb", "sleep 4321") > 0 }
	waitUntil(t, "the exec", 20*time.Second, running)
	if err := env.StopContainerd(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = env.StartContainerd(context.Background())
		}
	}()
	leave()
	<-answered
	waitUntil(t, "the abandoned exec killed with containerd away", 8*time.Second, func() bool { return !running() })
	if err := env.StartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	waitUntil(t, "the exec's FIFOs released once containerd is back", 20*time.Second, func() bool {
		return slices.Equal(fifoDirs(), before)
	})
}

// TestHTTPAPIStopKills: a server stopped (SIGTERM) while execs run, of
// the sandbox's task and of a branch, kills them, answers each with the
// reason and exits, releasing the execs. It closed its connections under
// them: a branch's exec answered "ttrpc: closed", the sandbox's was cut,
// and both commands ran on with their FIFOs behind.
func TestHTTPAPIStopKills(t *testing.T) {
	ctx, env, _, api, sb := apiSandbox(t)
	api.must(ctx, 200, "POST", sb+"/fork", map[string]any{"count": 1})
	before := fifoDirs()
	second := startServe(t, env, false)
	api2 := newUnixAPI(t, second)
	answers := make(chan apiResult, 2)
	for _, br := range []string{"0", "1"} {
		go func() {
			var r apiResult
			defer func() { answers <- r }()
			r = api2.do(ctx, "POST", sb+"/branches/"+br+"/exec", map[string]any{"args": []string{"sh", "-c", "echo started; exec sleep 4322"}}, false)
		}()
	}
	running := func() int { return hostProcsWith(env.Namespace, "sb", "sleep 4322") }
	waitUntil(t, "both execs", 20*time.Second, func() bool { return running() == 2 })
	pid := second.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the server's exit", 20*time.Second, func() bool { return syscall.Kill(pid, 0) == syscall.ESRCH })
	for range 2 {
		r := <-answers
		_, _, exit, kind := execOut(r.Lines)
		if r.Status != 200 || kind != "unavailable" || exit == nil || exit["exitCode"] != float64(137) || !strings.Contains(string(r.Body), "the server stopped") {
			t.Fatalf("an exec when its server stopped: %d %s", r.Status, r.Body)
		}
	}
	if n := running(); n != 0 {
		t.Fatalf("%d commands run on after their server stopped", n)
	}
	if after := fifoDirs(); !slices.Equal(after, before) {
		t.Fatalf("exec FIFOs before %v, after %v", before, after)
	}
}
