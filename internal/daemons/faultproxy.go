//go:build linux

package daemons

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
)

// Fault is what a FaultProxy does to a request it fails.
type Fault int

const (
	// FaultReset closes the connection without an answer: a registry
	// that went away.
	FaultReset Fault = iota + 1
	// FaultUnavailable answers 503 Service Unavailable.
	FaultUnavailable
	// FaultCorrupt passes the request on and changes one byte of a
	// successful answer's body: a blob that arrives damaged.
	FaultCorrupt
	// FaultHang holds the request until the client gives up on it (its
	// context is cancelled, or the connection closes).
	FaultHang
)

func (f Fault) String() string {
	switch f {
	case FaultReset:
		return "reset"
	case FaultUnavailable:
		return "unavailable"
	case FaultCorrupt:
		return "corrupt"
	case FaultHang:
		return "hang"
	}
	return fmt.Sprintf("fault(%d)", int(f))
}

// FaultProxy is an HTTP proxy on a free 127.0.0.1 port in front of a
// registry: it passes requests through, counting them, until the one a
// test chose, and fails that one and every one after it. A push or pull
// through it breaks at any request the test names, the same way each run.
type FaultProxy struct {
	// Host is 127.0.0.1:PORT, as an image reference names it.
	Host string

	l     net.Listener
	srv   *http.Server
	proxy *httputil.ReverseProxy

	mu       sync.Mutex
	seen     []string // "METHOD PATH" of each request, in order
	failFrom int      // 1-based number of the first request to fail; 0: none
	fault    Fault
	onFail   func()
	// failMethod and failPath, if set, name the first request to fail
	// instead of failFrom: the first with that method whose path
	// contains failPath.
	failMethod, failPath string
}

// NewFaultProxy starts a proxy to the registry at upstream (HOST:PORT,
// plain HTTP). Close it when done.
func NewFaultProxy(upstream string) (*FaultProxy, error) {
	target, err := url.Parse("http://" + upstream)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &FaultProxy{Host: l.Addr().String(), l: l}
	// The Host header stays the proxy's, so the registry's upload
	// locations name the proxy and the client comes back through it.
	p.proxy = httputil.NewSingleHostReverseProxy(target)
	p.proxy.ModifyResponse = p.modify
	// A client that gives up mid-answer is what the tests do on purpose.
	p.proxy.ErrorLog = log.New(io.Discard, "", 0)
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve)}
	go func() { _ = p.srv.Serve(l) }()
	return p, nil
}

// Fail makes request number n (1-based, counted since the last Reset) and
// every later one fail with f; onFail, if set, runs once, as request n
// arrives. n 0 passes everything.
func (p *FaultProxy) Fail(n int, f Fault, onFail func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failFrom, p.fault, p.onFail = n, f, onFail
}

// FailRequest is Fail from the first request with method whose path
// contains path: a request a test names by what it is rather than by its
// place (which changes as a registry keeps the blobs of earlier tries).
func (p *FaultProxy) FailRequest(method, path string, f Fault, onFail func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failFrom, p.fault, p.onFail = 0, f, onFail
	p.failMethod, p.failPath = method, path
}

// Reset forgets the requests seen and passes everything again.
func (p *FaultProxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen, p.failFrom, p.fault, p.onFail = nil, 0, 0, nil
	p.failMethod, p.failPath = "", ""
}

// Requests lists "METHOD PATH" of every request since the last Reset.
func (p *FaultProxy) Requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

// Close stops the proxy and drops its connections.
func (p *FaultProxy) Close() error {
	return p.srv.Close()
}

// faultKey marks a request the proxy passes on to be corrupted.
type faultKey struct{}

func (p *FaultProxy) serve(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.seen = append(p.seen, r.Method+" "+r.URL.Path)
	n := len(p.seen)
	if p.failMethod != "" && p.failFrom == 0 && r.Method == p.failMethod && strings.Contains(r.URL.Path, p.failPath) {
		p.failFrom = n
	}
	fault := Fault(0)
	var onFail func()
	if p.failFrom > 0 && n >= p.failFrom {
		fault = p.fault
		if n == p.failFrom {
			onFail = p.onFail
		}
	}
	p.mu.Unlock()
	if onFail != nil {
		onFail()
	}
	switch fault {
	case FaultReset:
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	case FaultUnavailable:
		http.Error(w, "fault proxy: unavailable", http.StatusServiceUnavailable)
		return
	case FaultHang:
		<-r.Context().Done()
		return
	case FaultCorrupt:
		r = r.WithContext(context.WithValue(r.Context(), faultKey{}, true))
	}
	p.proxy.ServeHTTP(w, r)
}

// modify corrupts the body of a successful answer to a request serve
// marked: the first byte is inverted, so the size stays and the digest
// does not.
func (p *FaultProxy) modify(resp *http.Response) error {
	if resp.Request.Context().Value(faultKey{}) == nil || resp.StatusCode != http.StatusOK || resp.Body == nil {
		return nil
	}
	resp.Body = &corruptBody{ReadCloser: resp.Body}
	return nil
}

// corruptBody inverts the first byte read through it.
type corruptBody struct {
	io.ReadCloser
	done bool
}

func (c *corruptBody) Read(b []byte) (int, error) {
	n, err := c.ReadCloser.Read(b)
	if n > 0 && !c.done {
		b[0] ^= 0xff
		c.done = true
	}
	return n, err
}
