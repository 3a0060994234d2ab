//go:build linux

package ops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// Files of a branch are read and written through its init's root,
// /proc/PID/root, as the branch's own processes see them: its rootfs
// (sealed read-only while it has branches: writes then fail) and whatever
// is mounted in its mount namespace. Paths are resolved with openat2's
// RESOLVE_IN_ROOT, so that no symlink a branch made leads out of it.
const inRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// initPid is the pid of branch id's init; c is the sandbox's container,
// whose task's init is branch 0's, ctx in its namespace.
func initPid(ctx context.Context, c containerd.Container, sc *client.SandboxClient, id string) (int, error) {
	if id == branch.RootID || id == "" {
		t, err := c.Task(ctx, nil)
		if err != nil {
			return 0, fmt.Errorf("sandbox %s has no task: %w", sc.ID, err)
		}
		return int(t.Pid()), nil
	}
	nodes, err := sc.Tree(ctx)
	if err != nil {
		return 0, err
	}
	for _, n := range nodes {
		if n.ID != id {
			continue
		}
		if n.State != branch.Live {
			if n.State == branch.Stale {
				return 0, &branch.StaleError{Branch: id, Winner: n.Winner}
			}
			return 0, fmt.Errorf("branch %s is %s: %w", id, n.State, errdefs.ErrFailedPrecondition)
		}
		if n.InitPid == 0 {
			return 0, fmt.Errorf("branch %s has no running init (status %q): %w", id, n.Status, errdefs.ErrFailedPrecondition)
		}
		return n.InitPid, nil
	}
	return 0, fmt.Errorf("no branch %s in sandbox %s (see its branches with tree): %w", id, sc.ID, errdefs.ErrNotFound)
}

// CheckPath refuses a path that is not absolute, and cleans it.
func CheckPath(p string) (string, error) {
	if p == "" || !path.IsAbs(p) {
		return "", fmt.Errorf("path %q: give an absolute path in the branch: %w", p, errdefs.ErrInvalidArgument)
	}
	return path.Clean(p), nil
}

func openIn(root *os.File, p string, flags int, mode uint32) (*os.File, error) {
	for {
		fd, err := unix.Openat2(int(root.Fd()), p, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: inRoot})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return nil, fileErr(p, err)
		}
		return os.NewFile(uintptr(fd), p), nil
	}
}

// fileErr says what an errno on a branch's file means in errdefs' terms.
func fileErr(p string, err error) error {
	var kind error
	hint := ""
	switch {
	case errors.Is(err, unix.ENOENT):
		kind = errdefs.ErrNotFound
	case errors.Is(err, unix.EROFS):
		kind, hint = errdefs.ErrFailedPrecondition, " (the sandbox or a branch is read-only while it has live branches: write in one of those, or commit or abort them)"
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		kind = errdefs.ErrPermissionDenied
	case errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENAMETOOLONG):
		kind = errdefs.ErrInvalidArgument
	case errors.Is(err, unix.ENXIO), errors.Is(err, unix.ENODEV):
		// A fifo with no reader, a device with none behind it.
		kind, hint = errdefs.ErrInvalidArgument, " (not a regular file)"
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		kind = errdefs.ErrResourceExhausted
	default:
		return &PathError{Path: p, err: fmt.Errorf("%s: %w", p, err)}
	}
	return &PathError{Path: p, err: fmt.Errorf("%s: %v%s: %w", p, err, hint, kind)}
}

// PathError is a failure on a path of a branch's files (not on the
// branch): a front's hint for a path not found is about paths, not
// branches.
type PathError struct {
	Path string
	err  error
}

func (e *PathError) Error() string { return e.err.Error() }
func (e *PathError) Unwrap() error { return e.err }

// OpenFile opens a regular file of a branch for reading.
func OpenFile(root *Root, p string) (*File, error) {
	return openRegular(root, p, unix.O_RDONLY, "; list a directory instead")
}

// osFileErr is fileErr of the errno an *os.PathError carries, or err.
func osFileErr(p string, err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fileErr(p, pe.Err)
	}
	return err
}

// openRegular opens the regular file at p with flags (O_RDONLY or
// O_WRONLY): first as a path only, which runs none of the file's own open
// (a device's, a fifo's waiting for a writer), to see what it is; then
// that same file again with flags, and a pseudo file (pseudo.go) with the
// capabilities root has in the sandbox, so that the kernel's checks at
// open are the sandbox's, not the server's.
func openRegular(root *Root, p string, flags int, notRegular string) (*File, error) {
	pf, err := openIn(root.dir, p, unix.O_PATH, 0)
	if err != nil {
		return nil, err
	}
	defer pf.Close()
	fi, err := pf.Stat()
	if err != nil {
		return nil, osFileErr(p, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)%s: %w", p, fi.Mode().Type(), notRegular, errdefs.ErrInvalidArgument)
	}
	pseudo := pseudoFS(int(pf.Fd()))
	// Through the open path's own link: the file seen above, whatever
	// the branch renames meanwhile.
	self := fmt.Sprintf("/proc/self/fd/%d", pf.Fd())
	open := func() (int, error) {
		for {
			fd, err := unix.Open(self, flags|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
			if err != unix.EINTR {
				return fd, err
			}
		}
	}
	var fd int
	if pseudo {
		fd, err = withCaps(root, open)
	} else {
		fd, err = open()
	}
	var errno unix.Errno
	switch {
	case errors.As(err, &errno) && pseudo:
		return nil, pseudoErr(p, errno, "takes no such open")
	case err != nil:
		return nil, fileErr(p, err)
	}
	return &File{File: os.NewFile(uintptr(fd), p), Info: fi, Pseudo: pseudo, path: p}, nil
}

// DirEntry is one entry of a directory listing.
type DirEntry struct {
	Name string `json:"name"`
	// Type: file, dir, symlink, or other.
	Type     string    `json:"type"`
	Size     int64     `json:"size"`
	Mode     string    `json:"mode"`
	Modified time.Time `json:"modified"`
	Target   string    `json:"target,omitempty"`
}

// ListDir lists a directory, by name; more than max entries is an error.
func ListDir(root *Root, p string, max int) ([]DirEntry, error) {
	d, err := openIn(root.dir, p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(max + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fileErr(p, err)
	}
	if len(names) > max {
		return nil, fmt.Errorf("%s has more than %d entries; list it with exec (ls) instead: %w", p, max, errdefs.ErrResourceExhausted)
	}
	sort.Strings(names)
	out := []DirEntry{}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(int(d.Fd()), n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // gone since it was listed
		}
		e := DirEntry{Name: n, Size: st.Size, Mode: fmt.Sprintf("%04o", st.Mode&0o7777), Modified: time.Unix(st.Mtim.Unix()).UTC()}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			e.Type = "file"
		case unix.S_IFDIR:
			e.Type = "dir"
		case unix.S_IFLNK:
			e.Type = "symlink"
			buf := make([]byte, unix.PathMax)
			if k, err := unix.Readlinkat(int(d.Fd()), n, buf); err == nil {
				e.Target = string(buf[:k])
			}
		default:
			e.Type = "other"
		}
		out = append(out, e)
	}
	return out, nil
}
