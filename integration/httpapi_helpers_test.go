//go:build linux

package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// served is a `branchctl serve` run for one test: its unix socket and, if
// asked, its TCP address.
type served struct {
	Socket   string
	TCP      string // http://127.0.0.1:PORT, or ""
	cmd      *exec.Cmd
	out      *syncBuffer
	done     chan error
	quitOnce sync.Once
}

// quit has the server print its goroutines (what it was doing, for a test
// that failed or hung) and exit.
func (s *served) quit() {
	s.quitOnce.Do(func() {
		_ = s.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case err := <-s.done:
			s.done <- err
		case <-time.After(10 * time.Second):
		}
	})
}

// startServe runs bin/branchctl serve against env with extra flags, waits
// for it to say where it listens, and stops it (SIGTERM, then SIGKILL) when
// the test ends; its socket must be gone by then.
func startServe(t testing.TB, env *daemons.Env, tcp bool, flags ...string) *served {
	t.Helper()
	dir := t.TempDir()
	s := &served{Socket: filepath.Join(dir, "api.sock"), out: &syncBuffer{}}
	args := append([]string{"serve", "--address", env.Address, "--socket", s.Socket}, flags...)
	if tcp {
		args = append(args, "--tcp", "127.0.0.1:0")
	}
	s.cmd = exec.Command(filepath.Join(env.BinDir, "branchctl"), args...)
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stderr = s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	s.done = done
	t.Cleanup(func() {
		failed := t.Failed()
		if failed {
			s.quit()
		}
		_ = s.cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-done
			t.Errorf("branchctl serve did not stop on SIGINT")
		}
		if _, err := os.Stat(s.Socket); err == nil && !failed {
			t.Errorf("branchctl serve left its socket %s", s.Socket)
		}
		if failed {
			t.Logf("branchctl serve's stderr:\n%s", s.out.String())
		}
	})
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	want := 1
	if tcp {
		want = 2
	}
	deadline := time.After(20 * time.Second)
	for got := 0; got < want; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("branchctl serve exited: %s", s.out)
			}
			if a, ok := strings.CutPrefix(l, "listening on http"); ok && strings.HasPrefix(l, "listening on http") {
				s.TCP = "http" + a
			}
			got++
		case <-deadline:
			t.Fatalf("branchctl serve did not say where it listens: %s", s.out)
		}
	}
	go func() {
		for range lines {
		}
	}()
	return s
}

// apiClient calls the HTTP API and checks every request and response
// against api/openapi/branchbox.json, recording the operations that
// succeeded (and the error kinds seen) so that a test can tell the whole
// contract was exercised.
type apiClient struct {
	t      *testing.T
	base   string
	hc     *http.Client
	token  string
	spec   *openapi3.T
	router routers.Router

	mu   sync.Mutex
	seen map[string]bool
}

func loadOpenAPI(t *testing.T) (*openapi3.T, routers.Router) {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("../api/openapi/branchbox.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("api/openapi/branchbox.json is not a valid OpenAPI 3 document: %v", err)
	}
	// Routed by path alone: the server is a unix socket or any TCP port.
	doc.Servers = nil
	r, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return doc, r
}

func unixHTTP(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

// newUnixAPI is a client on the server's unix socket.
func newUnixAPI(t *testing.T, s *served) *apiClient {
	spec, r := loadOpenAPI(t)
	return &apiClient{t: t, base: "http://branchbox", hc: unixHTTP(s.Socket), spec: spec, router: r, seen: map[string]bool{}}
}

// newTCPAPI is a client on the server's TCP address with a bearer token.
func newTCPAPI(t *testing.T, s *served, token string) *apiClient {
	spec, r := loadOpenAPI(t)
	return &apiClient{t: t, base: s.TCP, hc: &http.Client{}, token: token, spec: spec, router: r, seen: map[string]bool{}}
}

// apiSandbox starts the daemons and a server on them, and makes sandbox
// "sb" of the test image (sleeping) through it; every sandbox is removed
// when the test ends. It returns the client on the server's unix socket
// and the sandbox's path.
func apiSandbox(t *testing.T) (context.Context, *daemons.Env, *served, *apiClient, string) {
	ctx, env := startEnv(t)
	importImage(t, ctx, env, "branch")
	srv := startServe(t, env, false)
	api := newUnixAPI(t, srv)
	removeSandboxesAtEnd(t, srv, env.Namespace)
	ns := "/v1/namespaces/" + env.Namespace
	api.must(ctx, 201, "POST", ns+"/sandboxes", map[string]any{"id": "sb", "image": ociimage.ImageRef, "args": []string{"sleep", "100000"}})
	return ctx, env, srv, api, ns + "/sandboxes/sb"
}

// removeSandboxesAtEnd removes, when the test ends (failed or not), every
// sandbox of the namespace the server sees, before the daemons stop.
func removeSandboxesAtEnd(t *testing.T, s *served, ns string) {
	t.Cleanup(func() {
		hc := unixHTTP(s.Socket)
		resp, err := hc.Get("http://branchbox/v1/namespaces/" + ns + "/sandboxes")
		if err != nil {
			t.Errorf("list sandboxes to remove: %v", err)
			return
		}
		var list struct{ Sandboxes []struct{ ID string } }
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if err != nil {
			t.Errorf("list sandboxes to remove: %v", err)
			return
		}
		for _, sb := range list.Sandboxes {
			req, _ := http.NewRequest("DELETE", "http://branchbox/v1/namespaces/"+ns+"/sandboxes/"+sb.ID, nil)
			if resp, err := hc.Do(req); err != nil {
				t.Errorf("remove sandbox %s: %v", sb.ID, err)
			} else {
				resp.Body.Close()
			}
		}
	})
}

// apiResult is a response: its status, its body, and for an error its
// kind.
type apiResult struct {
	Status int
	Body   []byte
	Kind   string
	Lines  []map[string]any // a JSON-lines body
}

func (r apiResult) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decode %s: %v", r.Body, err)
	}
}

// call sends a request (body: JSON of v, or raw []byte) and checks both
// ends against the contract.
func (a *apiClient) call(ctx context.Context, method, path string, v any) apiResult {
	a.t.Helper()
	return a.do(ctx, method, path, v, true)
}

// bad sends a request that breaks the contract on purpose (the server
// must refuse it); the response is checked.
func (a *apiClient) bad(ctx context.Context, status int, kind, method, path string, v any) apiResult {
	a.t.Helper()
	r := a.do(ctx, method, path, v, false)
	if r.Status != status || r.Kind != kind {
		a.t.Fatalf("%s %s: want %d %s, got %d %q: %s", method, path, status, kind, r.Status, r.Kind, r.Body)
	}
	return r
}

func (a *apiClient) do(ctx context.Context, method, path string, v any, checkRequest bool) apiResult {
	a.t.Helper()
	var body []byte
	ctype := ""
	switch b := v.(type) {
	case nil:
	case []byte:
		body, ctype = b, "application/octet-stream"
	default:
		var err error
		if body, err = json.Marshal(v); err != nil {
			a.t.Fatal(err)
		}
		ctype = "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	route, params, err := a.router.FindRoute(req)
	if err != nil {
		a.t.Fatalf("%s %s is not in the OpenAPI document: %v", method, path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil && checkRequest {
		a.t.Fatalf("%s %s: the request breaks the contract: %v", method, path, err)
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := a.hc.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatalf("%s %s: read the response: %v", method, path, err)
	}
	res := apiResult{Status: resp.StatusCode, Body: out}
	ndjson := strings.HasPrefix(resp.Header.Get("Content-Type"), "application/x-ndjson")
	check := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Body: io.NopCloser(bytes.NewReader(out)), Options: &openapi3filter.Options{IncludeResponseStatus: true, ExcludeResponseBody: ndjson}}
	if err := openapi3filter.ValidateResponse(ctx, check); err != nil {
		a.t.Fatalf("%s %s: the response (%d %s) breaks the contract: %v", method, path, resp.StatusCode, out, err)
	}
	if ndjson {
		schema := route.Operation.Responses.Status(resp.StatusCode).Value.Content.Get("application/x-ndjson").Schema.Value
		for _, l := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
			var line any
			if err := json.Unmarshal(l, &line); err != nil {
				a.t.Fatalf("%s %s: a line of the stream is not JSON: %q", method, path, l)
			}
			if err := schema.VisitJSON(line); err != nil {
				a.t.Fatalf("%s %s: a line of the stream breaks the contract: %s: %v", method, path, l, err)
			}
			res.Lines = append(res.Lines, line.(map[string]any))
		}
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Error struct{ Kind string }
		}
		_ = json.Unmarshal(out, &e)
		res.Kind = e.Error.Kind
	} else if checkRequest {
		a.mu.Lock()
		a.seen[route.Operation.OperationID] = true
		a.mu.Unlock()
	}
	return res
}

// must is call that wants status want.
func (a *apiClient) must(ctx context.Context, want int, method, path string, v any) apiResult {
	a.t.Helper()
	r := a.call(ctx, method, path, v)
	if r.Status != want {
		a.t.Fatalf("%s %s: want %d, got %d: %s", method, path, want, r.Status, r.Body)
	}
	return r
}

// fails is call that wants an error of kind with status.
func (a *apiClient) fails(ctx context.Context, status int, kind, method, path string, v any) apiResult {
	a.t.Helper()
	r := a.call(ctx, method, path, v)
	if r.Status != status || r.Kind != kind {
		a.t.Fatalf("%s %s: want %d %s, got %d %q: %s", method, path, status, kind, r.Status, r.Kind, r.Body)
	}
	return r
}

// unexercised lists the operations of the contract no call has succeeded
// with, among those of every client given.
func unexercised(spec *openapi3.T, clients ...*apiClient) []string {
	var out []string
	for _, p := range spec.Paths.Map() {
		for _, op := range p.Operations() {
			done := false
			for _, c := range clients {
				c.mu.Lock()
				done = done || c.seen[op.OperationID]
				c.mu.Unlock()
			}
			if !done {
				out = append(out, op.OperationID)
			}
		}
	}
	sort.Strings(out)
	return out
}

func execOut(lines []map[string]any) (stdout, stderr string, exit map[string]any, errKind string) {
	for _, l := range lines {
		if s, ok := l["stdout"].(string); ok {
			stdout += s
		}
		if s, ok := l["stderr"].(string); ok {
			stderr += s
		}
		if e, ok := l["exit"].(map[string]any); ok {
			exit = e
		}
		if e, ok := l["error"].(map[string]any); ok {
			errKind = fmt.Sprint(e["kind"])
		}
	}
	return stdout, stderr, exit, errKind
}
