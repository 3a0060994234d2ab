//go:build linux

package oci

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/lockedthread"
)

// inOwnMountNamespace runs fn on a thread of its own in a mount namespace
// of its own (a copy of the process's, with no propagation back), so that
// what fn mounts goes with that thread, and so with the process however it
// ends (a push killed in the middle of a layer, say), not only when fn
// unmounts it. Files fn reads must be read on its goroutine.
func inOwnMountNamespace(fn func() error) error {
	errc := make(chan error, 1)
	lockedthread.Go(func() { errc <- inNewNamespace(fn) })
	return <-errc
}

// inNewNamespace moves the calling goroutine's locked thread, never
// unlocked (it ends with its goroutine), into a new mount namespace and
// runs fn there.
func inNewNamespace(fn func() error) error {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("a mount namespace of its own for the layer's mounts: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("keep the layer's mounts out of the host's mount namespace: %w", err)
	}
	return fn()
}
