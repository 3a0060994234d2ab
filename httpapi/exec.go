//go:build linux

package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/ops"
)

// Exec is the body of POST .../branches/{branch}/exec.
type Exec struct {
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	// Stdin is the process's whole standard input; it reads EOF after it.
	Stdin *string `json:"stdin,omitempty"`
	// Timeout, in seconds, kills the process (SIGKILL) when it runs
	// longer; 0: none.
	Timeout float64 `json:"timeout,omitempty"`
}

// ExecEvent is one line of an exec's response, a stream of JSON lines
// (application/x-ndjson): output as it comes, then the exit status, or
// an error.
type ExecEvent struct {
	Stdout *string            `json:"stdout,omitempty"`
	Stderr *string            `json:"stderr,omitempty"`
	Exit   *client.ExitStatus `json:"exit,omitempty"`
	Error  *Error             `json:"error,omitempty"`
	// Running, the seconds the process has run, is sent after
	// Config.KeepAlive without output: an idle connection is what a
	// client's read timeout, or a proxy's, ends.
	Running *float64 `json:"running,omitempty"`
}

// ndjson writes JSON lines to a response, flushing each: the writes come
// from the two goroutines that copy a process's stdout and stderr. Lines
// wait until begin sends the status (output may come before the exec
// call returns), and are dropped after fail.
type ndjson struct {
	w     http.ResponseWriter
	ready chan struct{}

	mu    sync.Mutex
	ok    bool
	quiet bool      // no more keep-alive lines: the last line is next
	last  time.Time // of the last line sent
	enc   *json.Encoder
	f     http.Flusher
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	return &ndjson{w: w, ready: make(chan struct{})}
}

// begin sends the response's status and headers.
func (n *ndjson) begin() {
	n.mu.Lock()
	n.w.Header().Set("Content-Type", "application/x-ndjson")
	n.w.Header().Set("Cache-Control", "no-store")
	n.w.WriteHeader(http.StatusOK)
	n.f, _ = n.w.(http.Flusher)
	if n.f != nil {
		n.f.Flush()
	}
	n.enc, n.ok, n.last = json.NewEncoder(n.w), true, time.Now()
	n.mu.Unlock()
	close(n.ready)
}

// keepAlive sends the line line() makes whenever nothing was sent for
// every, from begin until stop. every 0 or less: none.
func (n *ndjson) keepAlive(every time.Duration, line func() any) (stop func()) {
	if every <= 0 {
		return func() {}
	}
	stopc, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		timer := time.NewTimer(every)
		defer timer.Stop()
		for {
			select {
			case <-stopc:
				return
			case <-timer.C:
			}
			n.mu.Lock()
			idle := time.Since(n.last)
			if n.ok && !n.quiet && idle >= every {
				// A client gone fails this write; the handler sees it
				// through the request's context.
				_ = n.writeLocked(line())
				idle = 0
			}
			n.mu.Unlock()
			timer.Reset(every - idle)
		}
	}()
	return sync.OnceFunc(func() {
		n.mu.Lock()
		n.quiet = true
		n.mu.Unlock()
		close(stopc)
		<-done
	})
}

// fail drops every line: the response is an error instead.
func (n *ndjson) fail() { close(n.ready) }

func (n *ndjson) send(v any) error {
	<-n.ready
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.ok {
		return nil
	}
	return n.writeLocked(v)
}

// writeLocked writes a line and flushes it; n.mu is held.
func (n *ndjson) writeLocked(v any) error {
	n.last = time.Now()
	if err := n.enc.Encode(v); err != nil {
		return err
	}
	if n.f != nil {
		n.f.Flush()
	}
	return nil
}

// streamWriter sends what a process writes as ExecEvents of one stream.
// Each stream is copied by one goroutine; a character split between two
// writes is held back until its end comes, so that every line is valid
// UTF-8 (JSON would replace the halves).
type streamWriter struct {
	out     *ndjson
	stderr  bool
	pending []byte
}

func (s *streamWriter) Write(p []byte) (int, error) {
	data := append(s.pending, p...)
	cut := len(data)
	// A rune is at most 4 bytes: look for an incomplete one at the end.
	for i := len(data) - 1; i >= 0 && i >= len(data)-utf8.UTFMax; i-- {
		if utf8.RuneStart(data[i]) {
			if !utf8.FullRune(data[i:]) {
				cut = i
			}
			break
		}
	}
	s.pending = append([]byte(nil), data[cut:]...)
	s.send(data[:cut])
	return len(p), nil
}

// flush sends what is held back: the process ended mid-character.
func (s *streamWriter) flush() {
	s.send(s.pending)
	s.pending = nil
}

func (s *streamWriter) send(b []byte) {
	if len(b) == 0 {
		return
	}
	// A process that writes bytes that are not UTF-8 gets one
	// replacement character per run of them.
	text := strings.ToValidUTF8(string(b), "\uFFFD")
	ev := ExecEvent{Stdout: &text}
	if s.stderr {
		ev = ExecEvent{Stderr: &text}
	}
	// A client that went away stops reading; the process's output is
	// then dropped rather than blocking it.
	_ = s.out.send(ev)
}

// exec runs a process in a branch and streams its output and exit status.
// A client that disconnects kills it.
func (s *Server) exec(w http.ResponseWriter, r request) error {
	var req Exec
	var input *bufio.Reader
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "application/x-ndjson" {
		var err error
		if input, err = s.interactive(w, r, &req); err != nil {
			return err
		}
	} else if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if len(req.Args) == 0 {
		return fmt.Errorf("exec: no command (args): %w", errdefs.ErrInvalidArgument)
	}
	release, err := s.limits.acquire(r.client, true)
	if err != nil {
		return err
	}
	defer release()
	sc, done, err := s.dial(r)
	if err != nil {
		return err
	}
	defer done()
	out := newNDJSON(w)
	stdout, stderr := &streamWriter{out: out}, &streamWriter{out: out, stderr: true}
	opts := client.ExecOptions{Args: req.Args, Env: req.Env, Cwd: req.Cwd, Stdout: stdout, Stderr: stderr}
	if req.Stdin != nil {
		opts.Stdin = strings.NewReader(*req.Stdin)
	}
	if input != nil {
		// The input is read while the output is written.
		rc := http.NewResponseController(w)
		if err := rc.EnableFullDuplex(); err != nil {
			return fmt.Errorf("interactive exec: %v: %w", err, errdefs.ErrNotImplemented)
		}
		// The connection ends with the exec: the read deadline below
		// leaves it unfit for another request.
		w.Header().Set("Connection", "close")
		pr, pw := io.Pipe()
		fed := make(chan struct{})
		go func() {
			defer close(fed)
			feed(input, pw)
		}()
		defer func() {
			// The feed must be done with the body before the handler
			// returns (the server then reads what is left of it, and
			// two reads at once panic): a process gone fails its
			// writes, and a read deadline ends a read that waits for
			// more input.
			pr.Close()
			_ = rc.SetReadDeadline(time.Now())
			<-fed
		}()
		opts.Stdin = pr
	}
	// The response's status is sent once the process exists: an exec
	// refused is an ordinary JSON error.
	p, err := ops.Exec(r.Context(), s.cc, sc, r.PathValue("branch"), opts)
	if err != nil {
		out.fail()
		return err
	}
	out.begin()
	started := time.Now()
	stopKeepAlive := out.keepAlive(s.cfg.KeepAlive, func() any {
		running := time.Since(started).Round(time.Millisecond).Seconds()
		return ExecEvent{Running: &running}
	})
	defer stopKeepAlive()
	// The timeout is the process's run, from its start.
	ctx := r.Context()
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.Timeout*float64(time.Second)))
		defer cancel()
	}
	st, err := p.Wait(ctx)
	// Wait returns once the output is drained: what a stream holds back
	// goes before the last line.
	end := func(evs ...ExecEvent) error {
		stopKeepAlive()
		stdout.flush()
		stderr.flush()
		for _, ev := range evs {
			_ = out.send(ev)
		}
		return nil
	}
	if err != nil && ops.Ended(ctx) {
		// Timed out or the client left: the process and its session
		// go (what it left running would hold its output), then its
		// status is collected so that its stdio is released.
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = p.KillAll(kctx, uint32(unix.SIGKILL))
		st, err = p.Wait(kctx)
		if s.stopping.Load() {
			e := Error{Kind: "unavailable", Message: fmt.Sprintf("exec %v: killed: the server stopped", req.Args)}
			if err != nil {
				return end(ExecEvent{Error: &e})
			}
			return end(ExecEvent{Exit: &st}, ExecEvent{Error: &e})
		}
		if err == nil && r.Context().Err() == nil {
			e := Error{Kind: "deadline-exceeded", Message: fmt.Sprintf("exec %v: killed after its timeout of %gs", req.Args, req.Timeout)}
			return end(ExecEvent{Exit: &st}, ExecEvent{Error: &e})
		}
	}
	if err != nil {
		e := errorOf(err)
		return end(ExecEvent{Error: &e})
	}
	return end(ExecEvent{Exit: &st})
}
