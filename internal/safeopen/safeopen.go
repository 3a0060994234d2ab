//go:build linux

// Package safeopen opens paths a branch controls without leaving the
// directory they are resolved in: openat2 with RESOLVE_BENEATH, and no
// symlink (or /proc magic link) followed on the way, the last element's
// included. The commit engine and the layer writer both walk trees whose
// every entry a sandbox could have made.
package safeopen

import "golang.org/x/sys/unix"

// Resolve is how every path is resolved: beneath the directory, following
// no symlink and no magic link.
const Resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// OpenBeneath opens name, relative to dirfd, with flags (O_CLOEXEC and
// O_NOFOLLOW added) and resolved as Resolve says; a path that would leave
// dirfd or cross a symlink fails (EXDEV, ELOOP). Interrupted calls, and
// EAGAIN from a rename racing the lookup, are retried.
func OpenBeneath(dirfd int, name string, flags int) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
			Resolve: Resolve,
		})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}
