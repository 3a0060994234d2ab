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
	"github.com/branchbox/branchbox/mcpserver"
)

// mcpCommand is `branchctl mcp`: the MCP server (mcpserver), over stdio
// for an agent that starts it as a command, or over streamable HTTP. Like
// serve, it is branchctl with another front: an agent's MCP configuration
// names a command, and this one is on every node that has branchbox.
func mcpCommand(inv *invocation) *cli.Command {
	return &cli.Command{
		Name: "mcp", Category: "servers",
		Usage: "serve the branch operations as MCP tools, over stdio or streamable HTTP (docs/mcp.md)",
		Description: `Scoped to the namespace (--namespace) and, with --sandbox, to one sandbox.
Over stdio (the default) stdout carries the protocol and nothing else.
--http ADDR serves streamable HTTP at /mcp instead; an address that is not
loopback needs --token-file (bearer tokens, as branchctl serve reads them)
and TLS (--tls-cert, --tls-key).`,
		Flags: withGlobals(
			&cli.StringFlag{Name: "sandbox", Usage: "the one sandbox the tools reach (id, prefix or name)"},
			&cli.StringFlag{Name: "http", Usage: "serve streamable HTTP on this address (HOST:PORT; port 0 picks one) instead of stdio"},
			&cli.StringFlag{Name: "token-file", Usage: "with --http: bearer tokens, lines of TOKEN NAMESPACE... (* for all)"},
			&cli.StringFlag{Name: "tls-cert", Usage: "with --http: TLS certificate (PEM)"},
			&cli.StringFlag{Name: "tls-key", Usage: "with --http: TLS key (PEM)"},
			&cli.IntFlag{Name: "max-output", Value: 64 << 10, Usage: "bytes of each of stdout and stderr an exec returns"},
			&cli.Int64Flag{Name: "max-file", Value: 1 << 20, Usage: "bytes of a file read or written"},
			&cli.IntFlag{Name: "max-execs", Value: 16, Usage: "commands running at once"},
		),
		Action: func(c *cli.Context) error {
			g := globalsOf(c)
			inv.namespace = g.namespace
			return cmdMCP(c, g, inv)
		},
	}
}

func cmdMCP(c *cli.Context, g globals, inv *invocation) error {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := mcpserver.New(ctx, mcpserver.Config{
		Address: g.address, Namespace: g.namespace, Sandbox: c.String("sandbox"),
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
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv.MCP() }, nil)
	mux.Handle("/mcp", authorized(tokens, g.namespace, h))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	fmt.Fprintf(inv.stdout, "listening on %s://%s/mcp\n", scheme, ln.Addr())
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
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
