//go:build linux

// Package server serves the branch snapshotter as containerd-branch-snapshotter
// does: containerd's snapshots API and the branch API over gRPC on one unix
// socket, the branch API over ttrpc beside it (SOCKET.ttrpc, for the
// shims), the address recorded in the root for shims that know only an
// upper directory, orphans reaped, and in-flight calls drained on shutdown.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter"
)

// drainTimeout bounds how long a shutdown waits for in-flight calls.
const drainTimeout = 10 * time.Second

// Config says what to serve where.
type Config struct {
	// Root is the directory holding snapshots and metadata.
	Root string
	// Address is the unix socket of the gRPC server; the ttrpc server
	// listens on Address + branch.TTRPCSuffix.
	Address string
	// ReapInterval is how often orphaned state is removed (0: only at start).
	ReapInterval time.Duration
	// FaultPoint, if set, names a fault point (snapshotter.Fault*) at which
	// the process kills itself with SIGKILL: the crash-safety tests arm it.
	FaultPoint string
	// SlowSeal, if set, is snapshotter.WithSlowSeal's threshold.
	SlowSeal *time.Duration
}

// Serve serves until ctx is done (then drains in-flight calls) or a
// server fails.
func Serve(ctx context.Context, cfg Config) error {
	root, address, reapInterval := cfg.Root, cfg.Address, cfg.ReapInterval
	root, err := filepath.Abs(root)
	if err != nil {
		return fmt.Errorf("--root: %w", err)
	}
	if address == "" {
		return fmt.Errorf("--address is empty: %w", errdefs.ErrInvalidArgument)
	}
	var opts []snapshotter.Opt
	if point := cfg.FaultPoint; point != "" {
		log.G(ctx).WithField("point", point).Warn("fault injection armed: the daemon kills itself there (tests only)")
		opts = append(opts, snapshotter.WithFaultHook(func(p string) {
			if p == point {
				_ = unix.Kill(os.Getpid(), unix.SIGKILL)
				select {} // never go on past the fault point
			}
		}))
	}
	if cfg.SlowSeal != nil {
		opts = append(opts, snapshotter.WithSlowSeal(*cfg.SlowSeal))
	}
	// New takes the root lock before anything else, so a second instance
	// fails here without touching the first one's socket.
	sn, err := snapshotter.New(ctx, root, opts...)
	if err != nil {
		return err
	}
	defer func() {
		if err := sn.Close(); err != nil {
			log.G(ctx).WithError(err).Warn("close snapshotter")
		}
	}()

	// The ttrpc socket is bound first: whoever finds the gRPC socket
	// answering (containerd, a test) finds it bound too, not a crashed
	// predecessor's stale one.
	ttrpcAddress := address + branch.TTRPCSuffix
	tl, err := listen(ttrpcAddress)
	if err != nil {
		return err
	}
	l, err := listen(address)
	if err != nil {
		tl.Close()
		return err
	}
	tsrv, err := ttrpc.NewServer()
	if err != nil {
		l.Close()
		tl.Close()
		return fmt.Errorf("ttrpc server: %w", err)
	}
	branchv1.RegisterTTRPCBranchesService(tsrv, snapshotter.NewTTRPCBranchService(sn.Branches))
	srv := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(srv, snapshotservice.FromSnapshotter(sn))
	branchv1.RegisterBranchesServer(srv, snapshotter.NewBranchService(sn.Branches))

	// A shim knows a sandbox's rootfs only by its upper directory, inside
	// root: this file tells it where the branch API is served.
	addrFile := filepath.Join(root, branch.AddressFile)
	if err := os.WriteFile(addrFile, []byte(address+"\n"), 0o600); err != nil {
		l.Close()
		tl.Close()
		return fmt.Errorf("record address in %s: %w", addrFile, err)
	}
	defer os.Remove(addrFile)

	errc := make(chan error, 2)
	go func() {
		if err := srv.Serve(l); err != nil {
			errc <- fmt.Errorf("serve %s: %w", address, err)
		}
	}()
	go func() {
		// Not ctx: calls in flight at SIGTERM are drained, not cancelled.
		if err := tsrv.Serve(context.WithoutCancel(ctx), tl); err != nil && !errors.Is(err, ttrpc.ErrServerClosed) {
			errc <- fmt.Errorf("serve %s: %w", ttrpcAddress, err)
		}
	}()
	log.G(ctx).WithFields(log.Fields{"root": root, "address": address, "ttrpc": ttrpcAddress}).Info("serving branch snapshotter")

	if reapInterval > 0 {
		// Orphans can appear while serving too: a sandbox removed while
		// its shim was dead, a removal that failed half way. The reaper
		// is waited for before the snapshotter closes.
		var reaper sync.WaitGroup
		defer reaper.Wait()
		reaper.Add(1)
		go func() {
			defer reaper.Done()
			t := time.NewTicker(reapInterval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if _, err := sn.Reap(ctx); err != nil {
						log.G(ctx).WithError(err).Warn("reap orphaned state")
					}
				}
			}
		}()
	}

	select {
	case err := <-errc:
		srv.Stop()
		tsrv.Close()
		os.Remove(address)
		os.Remove(ttrpcAddress)
		return err
	case <-ctx.Done():
	}
	log.G(ctx).Info("shutting down: draining in-flight calls")
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drainTimeout)
	defer cancel()
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	if err := tsrv.Shutdown(dctx); err != nil {
		tsrv.Close()
	}
	select {
	case <-done:
	case <-dctx.Done():
		log.G(ctx).Warn("drain timed out; closing remaining connections")
		srv.Stop()
	}
	os.Remove(address)
	os.Remove(ttrpcAddress)
	return nil
}

// listen binds the unix socket, replacing a stale one. Only a process that
// holds the root lock gets here, but the address might be shared with
// something else entirely, so a socket that still answers is left alone.
func listen(address string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(address), 0o700); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	if fi, err := os.Lstat(address); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("--address %s exists and is not a socket: %w", address, errdefs.ErrAlreadyExists)
		}
		if c, err := net.DialTimeout("unix", address, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("--address %s is served by another process: %w", address, errdefs.ErrAlreadyExists)
		}
		if err := os.Remove(address); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove stale socket %s: %w", address, err)
		}
	}
	l, err := net.Listen("unix", address)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", address, err)
	}
	if err := os.Chmod(address, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("restrict socket %s: %w", address, err)
	}
	return l, nil
}
