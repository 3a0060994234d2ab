//go:build linux

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/urfave/cli/v2"

	"github.com/branchbox/branchbox/httpapi"
	"github.com/branchbox/branchbox/internal/branchctl"
	"github.com/branchbox/branchbox/mcpserver"
)

func cmdMCP(c *cli.Context, e branchctl.Env) error {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	quietLogs()
	srv, err := mcpserver.New(ctx, mcpserver.Config{
		Address: e.Address, Namespace: e.Namespace, Sandbox: c.String("sandbox"),
		MaxOutput: c.Int("max-output"), MaxFile: c.Int64("max-file"), MaxExecs: c.Int("max-execs"),
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	addr := c.String("http")
	if addr == "" {
		err := srv.MCP().Run(ctx, &mcp.StdioTransport{})
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}
	var tokens *httpapi.Tokens
	if f := c.String("token-file"); f != "" {
		if tokens, err = httpapi.NewTokens(f); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("mcp: listen on %s: %w", addr, err)
	}
	scheme := "http"
	if cert, key := c.String("tls-cert"), c.String("tls-key"); cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			ln.Close()
			return fmt.Errorf("mcp: --tls-cert and --tls-key: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		ln, scheme = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}), "https"
	}
	if !ln.Addr().(*net.TCPAddr).IP.IsLoopback() && (tokens == nil || scheme != "https") {
		ln.Close()
		return fmt.Errorf("mcp --http %s: not a loopback address: it needs --token-file, and TLS (--tls-cert, --tls-key) so that tokens do not cross the network in clear: %w", addr, errdefs.ErrInvalidArgument)
	}
	mux := http.NewServeMux()
	h := mcpserver.KeepAlive(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv.MCP() }, nil), c.Duration("keepalive"))
	mux.Handle("/mcp", authorized(tokens, e.Namespace, endStreams(ctx, h)))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	shutDown := make(chan struct{})
	go func() {
		defer close(shutDown)
		<-ctx.Done()
		// The calls still running end first: their commands killed,
		// each call answers, and its stream ends.
		srv.Stop()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	fmt.Fprintf(e.Stdout, "listening on %s://%s/mcp\n", scheme, ln.Addr())
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	// Serve returns as the shutdown starts; the calls' answers are
	// written until it ends.
	<-shutDown
	return nil
}

// endStreams ends a session's stream (a GET, which lasts as long as its
// client) when ctx ends, so that the shutdown waits only for the calls'
// answers, not for clients to leave.
func endStreams(ctx context.Context, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			rctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			defer context.AfterFunc(ctx, cancel)()
			r = r.WithContext(rctx)
		}
		h.ServeHTTP(w, r)
	})
}

// authorized requires a bearer token that reaches namespace, when there is
// a token file.
func authorized(tokens *httpapi.Tokens, namespace string, h http.Handler) http.Handler {
	if tokens == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := httpapi.Bearer(r)
		ns, err := tokens.Namespaces(tok)
		if err == nil && !httpapi.Allowed(ns, namespace) {
			err = fmt.Errorf("the token does not reach namespace %q", namespace)
		}
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="branchbox"`)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
