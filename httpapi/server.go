//go:build linux

package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/api/openapi"
	"github.com/branchbox/branchbox/client"
)

// Config is how a Server runs.
type Config struct {
	// Address is containerd's socket.
	Address string
	// Namespaces are the containerd namespaces served; nil serves any.
	Namespaces []string
	// TokenFile is the bearer token file (auth.go). Requests over TCP
	// need a token from it; on the unix socket a token, if sent, narrows
	// what the request reaches.
	TokenFile string
	// MaxBody bounds a request's body (a file written in one request);
	// JSON bodies are bounded by MaxJSON.
	MaxBody, MaxJSON int64
	// MaxExecs and MaxStreams bound each client's concurrent execs and
	// open streams (events).
	MaxExecs, MaxStreams int
	// HostsDir is containerd's registry host configuration directory that
	// push and pull use; a client cannot name another.
	HostsDir string
	// KeepAlive is how long an exec's stream may go without a line
	// before a {"running": seconds} line is sent (0: DefaultKeepAlive;
	// negative: never).
	KeepAlive time.Duration
}

// Defaults for the bounds a Config leaves zero.
const (
	DefaultMaxBody    = 64 << 20
	DefaultMaxJSON    = 1 << 20
	DefaultMaxExecs   = 16
	DefaultMaxStreams = 8
	// DefaultKeepAlive is below the idle timeouts of common proxies and
	// load balancers (60 s) and of clients that set one.
	DefaultKeepAlive = 10 * time.Second
)

// Server is the HTTP API over one containerd.
type Server struct {
	cfg    Config
	cc     *containerd.Client
	tokens *Tokens
	limits *limits
	mux    *http.ServeMux
	// sandboxes keeps connections to shims between requests.
	sandboxes *sandboxCache
	// stopping is set once a serve's context ended: the requests'
	// contexts end with it, and an exec killed then says why.
	stopping atomic.Bool
}

// shutdownGrace bounds how long a server that stops waits for its
// requests: an exec's kill and the collection of its status take up to
// 10 s.
const shutdownGrace = 15 * time.Second

// New connects to containerd and makes the server's routes.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.MaxJSON <= 0 {
		cfg.MaxJSON = DefaultMaxJSON
	}
	if cfg.MaxExecs <= 0 {
		cfg.MaxExecs = DefaultMaxExecs
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	s := &Server{cfg: cfg, limits: newLimits(cfg.MaxExecs, cfg.MaxStreams), mux: http.NewServeMux(), sandboxes: newSandboxCache(cfg.Address)}
	if cfg.TokenFile != "" {
		t, err := NewTokens(cfg.TokenFile)
		if err != nil {
			return nil, err
		}
		s.tokens = t
	}
	cc, err := containerd.New(cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", cfg.Address, err)
	}
	s.cc = cc
	s.routes()
	return s, nil
}

// Close closes the connections to containerd and the shims.
func (s *Server) Close() error {
	s.sandboxes.close()
	return s.cc.Close()
}

// connInfo is what the server knows of a connection: the listener it came
// through, and on a unix socket the peer's uid.
type connInfo struct {
	tcp bool
	uid int
}

type connKey struct{}

// ServeUnix serves on a unix socket listener until ctx ends.
func (s *Server) ServeUnix(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, false)
}

// ServeTCP serves on a TCP listener (wrapped in TLS by the caller where
// it is not loopback) until ctx ends; every request needs a token.
func (s *Server) ServeTCP(ctx context.Context, ln net.Listener) error {
	if s.tokens == nil {
		return fmt.Errorf("serving TCP needs a token file (--token-file): %w", errdefs.ErrFailedPrecondition)
	}
	return s.serve(ctx, ln, true)
}

func (s *Server) serve(ctx context.Context, ln net.Listener, tcp bool) error {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		// Idle keep-alive connections go after a while (the SDKs dial
		// again); streams are not idle.
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		BaseContext:    func(net.Listener) context.Context { return ctx },
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			ci := connInfo{tcp: tcp, uid: -1}
			if uc, ok := c.(*net.UnixConn); ok {
				if raw, err := uc.SyscallConn(); err == nil {
					_ = raw.Control(func(fd uintptr) {
						if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
							ci.uid = int(cred.Uid)
						}
					})
				}
			}
			return context.WithValue(ctx, connKey{}, ci)
		},
	}
	done, shutDown := make(chan struct{}), make(chan struct{})
	defer close(done)
	go func() {
		defer close(shutDown)
		select {
		case <-ctx.Done():
			// The requests' contexts end with ctx: an exec kills its
			// process and answers, an event stream ends.
			s.stopping.Store(true)
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
			defer cancel()
			_ = hs.Shutdown(sctx)
		case <-done:
		}
	}()
	err := hs.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		// Serve returns as the shutdown starts: the requests finish
		// (and the caller closes the connections they use) after.
		<-shutDown
		return nil
	}
	return err
}

// request is one authenticated request: its namespace and its client.
type request struct {
	*http.Request
	ns     string
	client string
}

func (r request) ctx() context.Context { return namespaces.WithNamespace(r.Context(), r.ns) }

// ServeHTTP authenticates, scopes to the namespace in the path, and
// dispatches.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

type handler func(w http.ResponseWriter, r request) error

// scoped wraps a route under /v1/namespaces/{ns}/: the caller must reach
// ns, through a token (required over TCP) or the server's own list.
func (s *Server) scoped(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ns := r.PathValue("ns")
		rq, err := s.authorize(r, ns)
		if err == nil {
			err = h(w, rq)
		}
		if err != nil {
			writeError(w, stoppedErr(err, s.stopping.Load()))
		}
		l := log.G(r.Context()).WithFields(log.Fields{"method": r.Method, "path": r.URL.Path, "namespace": ns, "duration": time.Since(start)})
		if err != nil {
			l = l.WithError(err)
		}
		l.Debug("request")
	}
}

// stoppedErr is err as the client should read it: a request cut short
// because the server stopped (its context ends with the server's) is
// unavailable, not canceled, which says the client left. What it made
// is undone (the Go client's detached calls).
func stoppedErr(err error, stopping bool) error {
	if stopping && errors.Is(err, context.Canceled) {
		return fmt.Errorf("%v: the server stopped: %w", err, errdefs.ErrUnavailable)
	}
	return err
}

func (s *Server) authorize(r *http.Request, ns string) (request, error) {
	ci, _ := r.Context().Value(connKey{}).(connInfo)
	rq := request{Request: r, ns: ns, client: "unix:uid=" + strconv.Itoa(ci.uid)}
	if err := identifiers.Validate(ns); err != nil {
		return rq, fmt.Errorf("namespace %q: %v: %w", ns, err, errdefs.ErrInvalidArgument)
	}
	token, hasToken := Bearer(r)
	if ci.tcp && !hasToken {
		return rq, fmt.Errorf("a request over TCP needs a bearer token: %w", errdefs.ErrUnauthenticated)
	}
	reach := s.cfg.Namespaces
	if hasToken {
		if s.tokens == nil {
			return rq, fmt.Errorf("a bearer token was sent, but this server has no token file: %w", errdefs.ErrUnauthenticated)
		}
		list, err := s.tokens.Namespaces(token)
		if err != nil {
			return rq, err
		}
		if !Allowed(reach, ns) {
			list = nil
		}
		reach = list
		if reach == nil {
			reach = []string{}
		}
		sum := sha256.Sum256([]byte(token))
		rq.client = "token:" + hex.EncodeToString(sum[:8])
	}
	if !Allowed(reach, ns) {
		return rq, fmt.Errorf("namespace %q is not one this client may reach: %w", ns, errdefs.ErrPermissionDenied)
	}
	return rq, nil
}

// Bearer returns the request's bearer token, and whether it sent an
// Authorization header at all.
func Bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", false
	}
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", true // a token that is not one: refused
	}
	return strings.TrimSpace(tok), true
}

// decode reads a JSON body of at most MaxJSON bytes into v, refusing
// fields the contract does not have.
func (s *Server) decode(w http.ResponseWriter, r request, v any) error {
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxJSON)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("the request needs a JSON body: %w", errdefs.ErrInvalidArgument)
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return fmt.Errorf("request body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// dial returns a client of the sandbox the path names, and what to call
// when done with it.
func (s *Server) dial(r request) (*client.SandboxClient, func(), error) {
	return s.sandboxes.get(r.Context(), r.ns, r.PathValue("sandbox"))
}

func (s *Server) routes() {
	m := s.mux
	m.HandleFunc("GET /v1/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openapi.Spec)
	})
	routes := s.routeTable()
	methods := map[string][]string{}
	for pattern, h := range routes {
		m.HandleFunc(pattern, s.scoped(h))
		method, path, _ := strings.Cut(pattern, " ")
		methods[path] = append(methods[path], method)
	}
	// A path with a method it does not take is answered in JSON too
	// (ServeMux's own 405 is text).
	for path, ms := range methods {
		sort.Strings(ms)
		allow := strings.Join(ms, ", ")
		m.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeJSON(w, http.StatusMethodNotAllowed, errorDoc{Error: Error{Kind: "not-found",
				Message: fmt.Sprintf("%s %s: this path takes %s", r.Method, r.URL.Path, allow),
				Hint:    "the routes are in GET /v1/openapi.json"}})
		})
	}
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, fmt.Errorf("no route %s %s (the routes are in GET /v1/openapi.json): %w", r.Method, r.URL.Path, errdefs.ErrNotFound))
	})
}

// routeTable is every route but the document's, by ServeMux pattern; each
// is in api/openapi/branchbox.json (TestRoutesAreTheContract).
func (s *Server) routeTable() map[string]handler {
	const ns = "/v1/namespaces/{ns}"
	const sb = ns + "/sandboxes/{sandbox}"
	const br = sb + "/branches/{branch}"
	return map[string]handler{
		"GET " + ns + "/sandboxes":             s.listSandboxes,
		"POST " + ns + "/sandboxes":            s.createSandbox,
		"DELETE " + sb:                         s.removeSandbox,
		"POST " + sb + "/fork":                 s.fork,
		"GET " + sb + "/tree":                  s.tree,
		"POST " + br + "/exec":                 s.exec,
		"POST " + br + "/commit":               s.commit,
		"POST " + br + "/abort":                s.abort,
		"GET " + br + "/logs":                  s.logs,
		"GET " + br + "/files":                 s.readFile,
		"PUT " + br + "/files":                 s.writeFile,
		"GET " + br + "/dir":                   s.listDir,
		"GET " + sb + "/checkpoints":           s.listCheckpoints,
		"POST " + sb + "/checkpoints":          s.checkpoint,
		"DELETE " + sb + "/checkpoints/{name}": s.deleteCheckpoint,
		"POST " + sb + "/rollback":             s.rollback,
		"POST " + sb + "/push":                 s.push,
		"POST " + ns + "/pull":                 s.pull,
		"GET " + ns + "/events":                s.events,
	}
}
