//go:build linux

package daemons

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Reboot does to the env what a node's power cut and boot do (PowerCut,
// then Boot).
func (e *Env) Reboot(ctx context.Context) error {
	if err := e.PowerCut(); err != nil {
		return err
	}
	return e.Boot(ctx)
}

// Boot starts the snapshotter and containerd again after PowerCut, as a
// booting node starts them.
func (e *Env) Boot(ctx context.Context) error {
	if err := e.StartSnapshotter(ctx); err != nil {
		return err
	}
	return e.startContainerd(ctx)
}

// PowerCut does to the env what a node's power cut does: every process of
// it ends at once (containerd, the snapshotter, the shims, the containers
// and their branches, SIGKILL), and what a node keeps in memory is gone:
// every mount, the cgroups, containerd's state directory and the
// runtimes' state under /run/containerd (tmpfs on a node). What is on
// disk stays: containerd's root and the snapshotter's.
func (e *Env) PowerCut() error {
	var errs []error
	if e.containerd != nil {
		_ = e.containerd.stop(syscall.SIGKILL, 15*time.Second)
		e.containerd = nil
	}
	var sockets []string
	for _, pid := range e.ShimPids() {
		sockets = append(sockets, e.ShimSockets(pid)...)
		killTree(pid)
	}
	if e.snapshotter != nil {
		_ = e.snapshotter.stop(syscall.SIGKILL, 15*time.Second)
		e.snapshotter = nil
	}
	if _, err := KillCgroups(e.Namespace); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroups(e.Namespace); err != nil {
		errs = append(errs, err)
	}
	for _, s := range sockets {
		_ = os.Remove(s)
	}
	errs = append(errs, e.unmountAll()...)
	for _, d := range []string{e.ContainerdState, filepath.Join("/run/containerd/branch", e.Namespace), filepath.Join("/run/containerd/runc", e.Namespace)} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, fmt.Errorf("reboot: remove %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}
