//go:build linux

package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/api/openapi"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

type apiBranch struct {
	ID, Parent, State, Status, Winner string
	InitPid                           int
	MemoryFork                        bool
}

// apiBranches is fork's and tree's answer; Contexts is its branches under
// their old key (docs/design.md#names), which stays the same for now.
type apiBranches struct {
	Branches []apiBranch `json:"branches"`
	Contexts []apiBranch `json:"contexts"`
}

func (b apiBranches) sameUnderOldKey(t *testing.T) {
	t.Helper()
	if !slices.Equal(b.Branches, b.Contexts) {
		t.Fatalf("branches %+v, but contexts (their old key) %+v", b.Branches, b.Contexts)
	}
}

// TestHTTPAPI drives every operation of api/openapi/branchbox.json through
// `branchctl serve` against real daemons, checking each request and
// response against the document: sandboxes from an image, fork, files,
// exec with stdin and streamed output, checkpoints and rollback, commit
// (first wins, the sibling stale), abort, events, push and pull, and the
// errors with branchctl --json's kinds.
func TestHTTPAPI(t *testing.T) {
	ctx, env := startEnv(t)
	importImage(t, ctx, env, "branch")
	reg := startRegistry(t, daemons.RegistryConfig{})
	tokens := filepath.Join(t.TempDir(), "tokens")
	const tok = "0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(tokens, []byte("# test\n"+tok+" "+env.Namespace+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startServe(t, env, true, "--token-file", tokens)
	api := newUnixAPI(t, srv)
	tcp := newTCPAPI(t, srv, tok)
	ns := "/v1/namespaces/" + env.Namespace
	removeSandboxesAtEnd(t, srv, env.Namespace)

	// The contract is served as it is in the repository.
	doc := api.must(ctx, 200, "GET", "/v1/openapi.json", nil)
	if !bytes.Equal(doc.Body, openapi.Spec) {
		t.Fatal("GET /v1/openapi.json is not api/openapi/branchbox.json")
	}
	if r := api.must(ctx, 200, "GET", ns+"/sandboxes", nil); !strings.Contains(string(r.Body), `"sandboxes":[]`) {
		t.Fatalf("a fresh namespace lists sandboxes: %s", r.Body)
	}
	// Off the contract (a method a path does not take, a path that is
	// not one), the answer is a JSON error all the same.
	for _, c := range []struct {
		method, path string
		status       int
	}{{"GET", ns + "/sandboxes/sb/fork", 405}, {"POST", "/v1/nosuch", 404}} {
		req, _ := http.NewRequestWithContext(ctx, c.method, "http://branchbox"+c.path, nil)
		resp, err := api.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct{ Kind, Message string }
		}
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if err != nil || resp.StatusCode != c.status || e.Error.Kind != "not-found" {
			t.Fatalf("%s %s: %d %+v %v", c.method, c.path, resp.StatusCode, e, err)
		}
	}
	api.fails(ctx, 404, "not-found", "POST", ns+"/sandboxes", map[string]any{"id": "sb", "image": "docker.io/library/nosuch:1"})
	api.bad(ctx, 400, "invalid-argument", "POST", ns+"/sandboxes/sb/fork", map[string]any{"count": 1, "bogus": true})
	api.must(ctx, 201, "POST", ns+"/sandboxes", map[string]any{"id": "sb", "image": ociimage.ImageRef, "args": []string{"sleep", "100000"}})
	api.fails(ctx, 409, "already-exists", "POST", ns+"/sandboxes", map[string]any{"id": "sb", "image": ociimage.ImageRef, "args": []string{"sleep", "1"}})
	var list struct{ Sandboxes []struct{ ID, Status string } }
	api.must(ctx, 200, "GET", ns+"/sandboxes", nil).decode(t, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != "sb" || list.Sandboxes[0].Status != "running" {
		t.Fatalf("sandboxes: %+v", list)
	}
	sb := ns + "/sandboxes/sb"
	api.fails(ctx, 404, "not-found", "POST", ns+"/sandboxes/nosuch/fork", map[string]any{"count": 1})

	// Events, on TCP with the token, from before the fork.
	evctx, evcancel := context.WithCancel(ctx)
	defer evcancel()
	events := make(chan map[string]any, 64)
	go func() {
		defer close(events)
		req, _ := http.NewRequestWithContext(evctx, "GET", srv.TCP+ns+"/events?topic=/branch/", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
			t.Errorf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
			return
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var ev map[string]any
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Errorf("an event line is not JSON: %q", sc.Bytes())
				return
			}
			events <- ev
		}
	}()
	// The subscription is made when the stream's status is sent; give it
	// a moment before anything it should see.
	time.Sleep(300 * time.Millisecond)

	var kids apiBranches
	api.must(ctx, 200, "POST", sb+"/fork", map[string]any{"count": 2}).decode(t, &kids)
	kids.sameUnderOldKey(t)
	if len(kids.Branches) != 2 {
		t.Fatalf("fork: %+v", kids)
	}
	b1, b2 := kids.Branches[0].ID, kids.Branches[1].ID
	br1, br2 := sb+"/branches/"+b1, sb+"/branches/"+b2

	// Files: written in a branch, read back, listed; the sealed sandbox
	// refuses a write.
	q := func(p string) string { return "?path=" + url.QueryEscape(p) }
	api.must(ctx, 200, "PUT", br1+"/files"+q("/answer")+"&mode=0600", []byte("one\n"))
	if r := api.must(ctx, 200, "GET", br1+"/files"+q("/answer"), nil); string(r.Body) != "one\n" {
		t.Fatalf("read back %q", r.Body)
	}
	// A path not found is told apart from a branch not found.
	if r := api.fails(ctx, 404, "not-found", "GET", br2+"/files"+q("/answer"), nil); !strings.Contains(string(r.Body), "/dir?path=") {
		t.Fatalf("a file not found: the hint is not about paths: %s", r.Body)
	}
	if r := api.fails(ctx, 404, "not-found", "GET", sb+"/branches/99/files"+q("/answer"), nil); !strings.Contains(string(r.Body), "/tree") {
		t.Fatalf("a branch not found: the hint is not about branches: %s", r.Body)
	}
	// A file of /proc says its size is 0.
	if r := api.must(ctx, 200, "GET", br1+"/files"+q("/proc/meminfo"), nil); !strings.Contains(string(r.Body), "MemTotal:") {
		t.Fatalf("/proc/meminfo read %q", r.Body)
	}
	// A sysfs attribute says 4096 bytes: the body is what it holds (it
	// was announced as 4096 and cut short after 6).
	if r := api.must(ctx, 200, "GET", br1+"/files"+q("/sys/class/net/lo/mtu"), nil); string(r.Body) != "65536\n" {
		t.Fatalf("/sys/class/net/lo/mtu read %q", r.Body)
	}
	// The kernel's refusals are the request's, and its checks at open
	// are against the sandbox's capabilities: /proc/kmsg needs
	// CAP_SYSLOG, which the sandbox lacks (the server, the node's root,
	// opened it and waited for the node's kernel log).
	api.fails(ctx, 400, "invalid-argument", "GET", sb+"/branches/0/files"+q("/proc/1/mem"), nil)
	api.fails(ctx, 403, "permission-denied", "GET", br1+"/files"+q("/proc/kmsg"), nil)
	api.fails(ctx, 412, "failed-precondition", "PUT", br1+"/files"+q("/proc/sys/kernel/hostname"), []byte("x"))
	api.fails(ctx, 412, "failed-precondition", "PUT", sb+"/branches/0/files"+q("/answer"), []byte("root\n"))
	api.fails(ctx, 400, "invalid-argument", "GET", br1+"/files"+q("relative"), nil)
	api.fails(ctx, 400, "invalid-argument", "GET", br1+"/files"+q("/etc"), nil)
	var dir struct {
		Entries []struct{ Name, Type, Mode string }
	}
	api.must(ctx, 200, "GET", br1+"/dir"+q("/"), nil).decode(t, &dir)
	found := false
	for _, e := range dir.Entries {
		found = found || (e.Name == "answer" && e.Type == "file" && e.Mode == "0600")
	}
	if !found {
		t.Fatalf("/ of branch %s: no file answer with mode 0600: %+v", b1, dir)
	}
	// A fifo is not a file to read or write (nor does opening it wait).
	api.must(ctx, 200, "POST", br1+"/exec", map[string]any{"args": []string{"mkfifo", "/fifo"}})
	api.fails(ctx, 400, "invalid-argument", "GET", br1+"/files"+q("/fifo"), nil)
	api.fails(ctx, 400, "invalid-argument", "PUT", br1+"/files"+q("/fifo"), []byte("x"))
	// A symlink the branch made does not lead out of it.
	api.must(ctx, 200, "POST", br1+"/exec", map[string]any{"args": []string{"ln", "-s", "/../../../../etc/hostname", "/escape"}})
	api.must(ctx, 200, "PUT", br1+"/files"+q("/etc/hostname"), []byte("inside\n"))
	if r := api.must(ctx, 200, "GET", br1+"/files"+q("/escape"), nil); string(r.Body) != "inside\n" {
		t.Fatalf("a symlink resolved outside the branch: %q", r.Body)
	}

	// Exec: stdin, both streams, the exit status.
	r := api.must(ctx, 200, "POST", br1+"/exec", map[string]any{
		"args":  []string{"sh", "-c", `cat /answer; read x; echo "got $x"; echo oops >&2; exit 3`},
		"stdin": "hello\n", "env": []string{"A=1"},
	})
	stdout, stderr, exit, kind := execOut(r.Lines)
	if stdout != "one\ngot hello\n" || stderr != "oops\n" || exit == nil || exit["exitCode"] != float64(3) || kind != "" {
		t.Fatalf("exec: stdout %q stderr %q exit %v error %q", stdout, stderr, exit, kind)
	}
	// Interactive: the request's body streams stdin while the response
	// streams the output (full duplex); the first answer comes before the
	// input ends.
	pr, pw := io.Pipe()
	ireq, _ := http.NewRequestWithContext(ctx, "POST", "http://branchbox"+br1+"/exec", pr)
	ireq.Header.Set("Content-Type", "application/x-ndjson")
	go func() {
		_, _ = io.WriteString(pw, `{"args": ["sh", "-c", "while read l; do echo \"got $l\"; done"]}`+"\n"+`{"stdin": "one\n"}`+"\n")
	}()
	iresp, err := api.hc.Do(ireq)
	if err != nil || iresp.StatusCode != 200 {
		t.Fatalf("interactive exec: %v %v", iresp, err)
	}
	lines := bufio.NewScanner(iresp.Body)
	var evs []map[string]any
	next := func() map[string]any {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("interactive exec: the stream ended: %v", lines.Err())
		}
		var ev map[string]any
		if err := json.Unmarshal(lines.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		if err := api.spec.Components.Schemas["ExecEvent"].Value.VisitJSON(ev); err != nil {
			t.Fatalf("an interactive exec's line breaks the contract: %v", err)
		}
		evs = append(evs, ev)
		return ev
	}
	if ev := next(); ev["stdout"] != "got one\n" {
		t.Fatalf("interactive exec, first answer: %v", ev)
	}
	_, _ = io.WriteString(pw, `{"stdin": "two\n"}`+"\n"+`{"eof": true}`+"\n")
	pw.Close()
	for ev := next(); ev["exit"] == nil; ev = next() {
	}
	iresp.Body.Close()
	if stdout, _, exit, _ = execOut(evs); stdout != "got one\ngot two\n" || exit["exitCode"] != float64(0) {
		t.Fatalf("interactive exec: %v", evs)
	}
	// A character split between two writes arrives whole.
	r = api.must(ctx, 200, "POST", br1+"/exec", map[string]any{"args": []string{"sh", "-c", `printf '\303'; sleep 0.2; printf '\251\n'; printf '\342\202' >&2`}})
	if stdout, stderr, _, _ = execOut(r.Lines); stdout != "é\n" || stderr != "\uFFFD" {
		t.Fatalf("split characters: stdout %q stderr %q", stdout, stderr)
	}
	// A timeout kills it, and the stream says so.
	start := time.Now()
	r = api.must(ctx, 200, "POST", br1+"/exec", map[string]any{"args": []string{"sleep", "100"}, "timeout": 0.5})
	if _, _, exit, kind = execOut(r.Lines); kind != "deadline-exceeded" || exit == nil || time.Since(start) > 20*time.Second {
		t.Fatalf("exec with a timeout: %s after %s", r.Body, time.Since(start))
	}
	api.bad(ctx, 400, "invalid-argument", "POST", br1+"/exec", map[string]any{"args": []string{}})

	// Checkpoints and rollback, in a branch.
	api.must(ctx, 200, "POST", sb+"/checkpoints", map[string]any{"branch": b1, "name": "c1"})
	api.must(ctx, 200, "PUT", br1+"/files"+q("/answer"), []byte("two\n"))
	var cks struct {
		Checkpoints []struct {
			Name            string
			Branch, Context string
		}
	}
	api.must(ctx, 200, "GET", sb+"/checkpoints", nil).decode(t, &cks)
	if len(cks.Checkpoints) != 1 || cks.Checkpoints[0].Name != "c1" || cks.Checkpoints[0].Branch != b1 || cks.Checkpoints[0].Context != b1 {
		t.Fatalf("checkpoints: %+v", cks)
	}
	api.must(ctx, 200, "POST", sb+"/rollback", map[string]any{"branch": b1, "name": "c1"})
	if r := api.must(ctx, 200, "GET", br1+"/files"+q("/answer"), nil); string(r.Body) != "one\n" {
		t.Fatalf("after rollback to c1: %q", r.Body)
	}
	api.fails(ctx, 404, "not-found", "POST", sb+"/rollback", map[string]any{"branch": b1, "name": "nosuch"})

	// Commit: the first wins, the sibling is stale.
	var cm struct {
		Commit struct {
			Parent      struct{ ID string }
			Invalidated []string
		}
	}
	api.must(ctx, 200, "POST", br1+"/commit", nil).decode(t, &cm)
	if cm.Commit.Parent.ID != "0" || !slices.Equal(cm.Commit.Invalidated, []string{b2}) {
		t.Fatalf("commit: %+v", cm)
	}
	api.fails(ctx, 409, "stale", "POST", br2+"/exec", map[string]any{"args": []string{"true"}})
	api.fails(ctx, 409, "stale", "POST", br2+"/commit", nil)
	if r := api.must(ctx, 200, "GET", sb+"/branches/0/files"+q("/answer"), nil); string(r.Body) != "one\n" {
		t.Fatalf("the sandbox after the commit: %q", r.Body)
	}
	// A process in the sandbox itself is an exec of its task.
	r = api.must(ctx, 200, "POST", sb+"/branches/0/exec", map[string]any{"args": []string{"sh", "-c", "read x; cat /answer; echo $x; exit 5"}, "stdin": "in-root\n"})
	if stdout, _, exit, _ = execOut(r.Lines); stdout != "one\nin-root\n" || exit == nil || exit["exitCode"] != float64(5) {
		t.Fatalf("exec in the sandbox: %s", r.Body)
	}
	// Its output is whole every time (an exec's exit can come before its
	// output), and its timeout kills it too.
	for i := 0; i < 10; i++ {
		r = api.must(ctx, 200, "POST", sb+"/branches/0/exec", map[string]any{"args": []string{"cat", "/answer"}})
		if stdout, _, _, _ = execOut(r.Lines); stdout != "one\n" {
			t.Fatalf("exec %d in the sandbox: %s", i, r.Body)
		}
	}
	start = time.Now()
	r = api.must(ctx, 200, "POST", sb+"/branches/0/exec", map[string]any{"args": []string{"sleep", "100"}, "timeout": 0.5})
	if _, _, exit, kind = execOut(r.Lines); kind != "deadline-exceeded" || exit == nil || time.Since(start) > 20*time.Second {
		t.Fatalf("exec in the sandbox with a timeout: %s after %s", r.Body, time.Since(start))
	}
	// The sandbox is writable again, and a checkpoint of it can go.
	api.must(ctx, 200, "PUT", sb+"/branches/0/files"+q("/root-file"), []byte("r\n"))
	api.must(ctx, 200, "POST", sb+"/checkpoints", map[string]any{"name": "r1"})
	api.must(ctx, 200, "DELETE", sb+"/checkpoints/r1", nil)
	api.fails(ctx, 404, "not-found", "DELETE", sb+"/checkpoints/r1", nil)

	// With memory: a checkpoint of the sandbox's processes, a fork with
	// them from it, and a memory fork of the live sandbox.
	var mck struct {
		Checkpoint struct {
			Name        string
			MemoryBytes int64 `json:"memory_bytes"`
		}
	}
	api.must(ctx, 200, "POST", sb+"/checkpoints", map[string]any{"name": "m1", "with_memory": true}).decode(t, &mck)
	if mck.Checkpoint.MemoryBytes == 0 {
		t.Fatalf("checkpoint with_memory: %+v", mck)
	}
	api.fails(ctx, 400, "invalid-argument", "POST", sb+"/rollback", map[string]any{"name": "m1", "with_memory": true})
	for _, body := range []map[string]any{{"from": "m1", "with_memory": true}, {"with_memory": true}} {
		var mk apiBranches
		api.must(ctx, 200, "POST", sb+"/fork", body).decode(t, &mk)
		if len(mk.Branches) != 1 || !mk.Branches[0].MemoryFork || mk.Branches[0].Status != "running" {
			t.Fatalf("fork %v: %+v", body, mk)
		}
		api.must(ctx, 200, "POST", sb+"/branches/"+mk.Branches[0].ID+"/abort", nil)
	}
	api.must(ctx, 200, "DELETE", sb+"/checkpoints/m1", nil)

	// A command's output, from the branch's log; none for the sandbox.
	var cmdKids apiBranches
	api.must(ctx, 200, "POST", sb+"/fork", map[string]any{"count": 1, "args": []string{"sh", "-c", "echo hello from the command; exec sleep 100000"}}).decode(t, &cmdKids)
	logs := sb + "/branches/" + cmdKids.Branches[0].ID + "/logs"
	waitUntil(t, "the command's output in its log", 10*time.Second, func() bool {
		return string(api.must(ctx, 200, "GET", logs, nil).Body) == "hello from the command\n"
	})
	api.fails(ctx, 400, "invalid-argument", "GET", sb+"/branches/0/logs", nil)
	api.must(ctx, 200, "POST", sb+"/branches/"+cmdKids.Branches[0].ID+"/abort", nil)

	// Abort.
	api.must(ctx, 200, "POST", sb+"/fork", map[string]any{"count": 1, "seal": "ro"}).decode(t, &kids)
	b3 := kids.Branches[0].ID
	var ab struct{ Abort struct{ Aborted []string } }
	api.must(ctx, 200, "POST", sb+"/branches/"+b3+"/abort", nil).decode(t, &ab)
	if !slices.Equal(ab.Abort.Aborted, []string{b3}) {
		t.Fatalf("abort: %+v", ab)
	}
	var tree apiBranches
	api.must(ctx, 200, "GET", sb+"/tree", nil).decode(t, &tree)
	tree.sameUnderOldKey(t)
	states := map[string]string{}
	for _, c := range tree.Branches {
		states[c.ID] = c.State
	}
	if states["0"] != "live" || states[b1] != "committed" || states[b2] != "stale" || states[b3] != "aborted" {
		t.Fatalf("tree: %v", states)
	}

	// The branch events came on the stream: the fork and the commit.
	var topics []string
	var evLines []map[string]any
	timeout := time.After(10 * time.Second)
	for !slices.Contains(topics, "/branch/commit") || !slices.Contains(topics, "/branch/fork") {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("the event stream ended; topics so far %v", topics)
			}
			evLines = append(evLines, ev)
			topics = append(topics, ev["topic"].(string))
		case <-timeout:
			t.Fatalf("no fork and commit events on the stream; topics %v", topics)
		}
	}
	evcancel()
	// The stream never ends by itself, so it is read above rather than by
	// call; its lines are checked against the contract here.
	evSchema := api.spec.Components.Schemas["Event"].Value
	for _, ev := range evLines {
		if err := evSchema.VisitJSON(ev); err != nil {
			t.Fatalf("an event breaks the contract: %v: %v", ev, err)
		}
	}
	tcp.seen["events"] = true

	// Push the sandbox, pull it as a new one, which starts with the change.
	ref := reg.Ref("branchbox/sb:api")
	api.must(ctx, 200, "POST", sb+"/push", map[string]any{"ref": ref, "plainHttp": true})
	var pl struct {
		Pull struct {
			Sandbox string
			Started bool
		}
	}
	api.must(ctx, 200, "POST", ns+"/pull", map[string]any{"ref": ref, "sandbox": "sb2", "plainHttp": true, "args": []string{"sleep", "100000"}}).decode(t, &pl)
	if !pl.Pull.Started {
		t.Fatalf("pull: %+v", pl)
	}
	if r := api.must(ctx, 200, "GET", ns+"/sandboxes/sb2/branches/0/files"+q("/answer"), nil); string(r.Body) != "one\n" {
		t.Fatalf("the pulled sandbox: %q", r.Body)
	}
	api.must(ctx, 200, "DELETE", ns+"/sandboxes/sb2", nil)

	// The shim's own bounds hold through the server, with branchctl's kind.
	r = api.do(ctx, "POST", sb+"/fork", map[string]any{"count": 100000}, true)
	out, _ := exec.CommandContext(ctx, filepath.Join(env.BinDir, "branchctl"), "--address", env.Address, "-n", env.Namespace, "--json", "fork", "sb", "-n", "100000").Output()
	var cli struct{ Error struct{ Kind string } }
	if err := json.Unmarshal(out, &cli); err != nil || cli.Error.Kind == "" || r.Kind != cli.Error.Kind || r.Status < 400 {
		t.Fatalf("fork -n 100000: the server says %d %q, branchctl --json %s", r.Status, r.Kind, out)
	}

	// A sandbox removed behind the server's back and made anew under the
	// same name is the new one (the server keeps connections to shims).
	api.must(ctx, 200, "POST", sb+"/fork", map[string]any{"count": 1})
	if _, err := env.Ctr(ctx, "task", "rm", "-f", "sb"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Ctr(ctx, "container", "rm", "sb"); err != nil {
		t.Fatal(err)
	}
	api.must(ctx, 201, "POST", ns+"/sandboxes", map[string]any{"id": "sb", "image": ociimage.ImageRef, "args": []string{"sleep", "100000"}})
	api.fails(ctx, 404, "not-found", "GET", sb+"/branches/0/files"+q("/answer"), nil)
	api.must(ctx, 200, "POST", sb+"/fork", map[string]any{"count": 1})
	var anew apiBranches
	api.must(ctx, 200, "GET", sb+"/tree", nil).decode(t, &anew)
	if anew.sameUnderOldKey(t); len(anew.Branches) != 2 {
		t.Fatalf("the new sandbox's tree: %+v", anew.Branches)
	}

	api.must(ctx, 200, "DELETE", sb, nil)
	api.fails(ctx, 404, "not-found", "DELETE", sb, nil)
	if r := api.must(ctx, 200, "GET", ns+"/sandboxes", nil); !strings.Contains(string(r.Body), `"sandboxes":[]`) {
		t.Fatalf("sandboxes left: %s", r.Body)
	}
	if left := unexercised(api.spec, api, tcp); len(left) > 0 {
		t.Fatalf("operations of the contract no call succeeded with: %v", left)
	}
}
