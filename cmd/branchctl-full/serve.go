//go:build linux

package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"
	"golang.org/x/sync/errgroup"

	"github.com/branchbox/branchbox/httpapi"
	"github.com/branchbox/branchbox/internal/branchctl"
)

func cmdServe(c *cli.Context, e branchctl.Env) error {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	quietLogs()
	cfg := httpapi.Config{
		Address: e.Address, Namespaces: c.StringSlice("serve-namespace"), TokenFile: c.String("token-file"),
		MaxBody: c.Int64("max-body"), MaxExecs: c.Int("max-execs"), MaxStreams: c.Int("max-streams"),
		HostsDir: c.String("hosts-dir"), KeepAlive: c.Duration("keepalive"),
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = -1 // --keepalive 0: none
	}
	sock, tcp := c.String("socket"), c.String("tcp")
	if sock == "" && tcp == "" {
		return fmt.Errorf("serve: nothing to listen on: give --socket or --tcp: %w", errdefs.ErrInvalidArgument)
	}
	if tcp != "" && cfg.TokenFile == "" {
		return fmt.Errorf("serve --tcp needs --token-file: every request over TCP carries a bearer token: %w", errdefs.ErrInvalidArgument)
	}
	var tlsConf *tls.Config
	if cert, key := c.String("tls-cert"), c.String("tls-key"); cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return fmt.Errorf("serve: --tls-cert and --tls-key: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	}
	srv, err := httpapi.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer srv.Close()
	eg, ctx := errgroup.WithContext(ctx)
	if sock != "" {
		ln, err := listenUnix(sock)
		if err != nil {
			return err
		}
		defer os.Remove(sock)
		fmt.Fprintf(e.Stdout, "listening on unix:%s\n", sock)
		eg.Go(func() error { return srv.ServeUnix(ctx, ln) })
	}
	if tcp != "" {
		ln, err := net.Listen("tcp", tcp)
		if err != nil {
			return fmt.Errorf("serve: listen on %s: %w", tcp, err)
		}
		addr := ln.Addr().(*net.TCPAddr)
		scheme := "http"
		if tlsConf != nil {
			ln, scheme = tls.NewListener(ln, tlsConf), "https"
		} else if !addr.IP.IsLoopback() {
			ln.Close()
			return fmt.Errorf("serve: %s is not a loopback address: tokens would cross the network in clear; give --tls-cert and --tls-key: %w", tcp, errdefs.ErrInvalidArgument)
		}
		fmt.Fprintf(e.Stdout, "listening on %s://%s\n", scheme, addr)
		eg.Go(func() error { return srv.ServeTCP(ctx, ln) })
	}
	return eg.Wait()
}

// listenUnix listens on path, replacing a socket no one serves (left by a
// server killed) but not one in use, and lets only its owner connect.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o711); err != nil {
		return nil, err
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("serve: another server answers on %s: %w", path, errdefs.ErrAlreadyExists)
	} else if !errors.Is(err, os.ErrNotExist) && strings.Contains(err.Error(), "connection refused") {
		_ = os.Remove(path)
	}
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("serve: listen on %s: %w", path, err)
	}
	return ln, nil
}
