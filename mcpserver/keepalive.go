package mcpserver

import (
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"
)

// DefaultKeepAlive is how long an event stream of the streamable HTTP
// transport stays without a byte before it gets a keep-alive comment.
const DefaultKeepAlive = 10 * time.Second

// KeepAlive wraps the streamable HTTP handler so that a response that is
// an event stream gets an SSE comment (": keepalive", which clients skip)
// after every interval in which nothing was written to it. The SDK sends
// a call's response headers with its first event: a call that reports no
// progress sent nothing until its result, and a proxy's idle timeout
// (nginx's proxy_read_timeout, 60 s; Node's fetch, 300 s) ended it.
func KeepAlive(h http.Handler, every time.Duration) http.Handler {
	if every <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A GET is the session's stream; a POST whose client takes an
		// event stream gets one for each call (the SDK answers JSON
		// only for what it refuses at once, 202 for notifications).
		stream := r.Method == http.MethodGet ||
			r.Method == http.MethodPost && strings.Contains(r.Header.Get("Accept"), "text/event-stream")
		if !stream {
			h.ServeHTTP(w, r)
			return
		}
		kw := &keepAliveWriter{w: w, header: http.Header{}, last: time.Now()}
		stop, stopped := make(chan struct{}), make(chan struct{})
		go kw.run(every, stop, stopped)
		// No comment once this returns: the writer is net/http's
		// again (until then it is still the response's).
		defer func() {
			close(stop)
			<-stopped
		}()
		h.ServeHTTP(kw, r)
	})
}

// keepAliveWriter serializes the handler's writes with its comments, which
// go only between events: the SDK writes each event whole, in one Write.
// The handler sets headers in a map of its own, copied to the
// connection's when the response starts: a comment may start it first,
// from another goroutine, which must not read a map the handler writes.
type keepAliveWriter struct {
	w      http.ResponseWriter
	header http.Header // the handler's

	mu      sync.Mutex
	last    time.Time // the last write, or the request's start
	started bool      // the status and headers are out
}

func (k *keepAliveWriter) run(every time.Duration, stop <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		t.Reset(k.comment(every))
	}
}

// comment writes a keep-alive comment if the response has been idle for
// every, and says how long to wait before looking again. A response not
// started yet is started as the SDK starts an event stream.
func (k *keepAliveWriter) comment(every time.Duration) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	if idle := time.Since(k.last); idle < every {
		return every - idle
	}
	if !k.started {
		h := k.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache, no-transform")
		h.Set("Connection", "keep-alive")
		k.started = true
	} else if !strings.HasPrefix(k.w.Header().Get("Content-Type"), "text/event-stream") {
		return every
	}
	if _, err := io.WriteString(k.w, ": keepalive\n\n"); err != nil {
		return every
	}
	_ = http.NewResponseController(k.w).Flush()
	k.last = time.Now()
	return every
}

// start copies the handler's headers to the connection's, if the response
// has not started; the caller holds k.mu. It says whether it started it.
func (k *keepAliveWriter) start() bool {
	if k.started {
		return false
	}
	maps.Copy(k.w.Header(), k.header)
	k.started = true
	return true
}

func (k *keepAliveWriter) Header() http.Header { return k.header }

func (k *keepAliveWriter) WriteHeader(code int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.start() {
		k.w.WriteHeader(code)
	}
	// Else a comment started it, as a 200 event stream: the SDK's
	// status, unless it refused the request at once.
}

func (k *keepAliveWriter) Write(p []byte) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.start()
	k.last = time.Now()
	return k.w.Write(p)
}

func (k *keepAliveWriter) Flush() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.start()
	_ = http.NewResponseController(k.w).Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (k *keepAliveWriter) Unwrap() http.ResponseWriter { return k.w }
