//go:build linux

package apply

import (
	"bytes"
	"errors"
	"unsafe"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/safeopen"
)

// openDir opens a directory beneath dirfd for reading its entries.
func openDir(dirfd int, name string) (int, error) {
	return safeopen.OpenBeneath(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
}

func lstatAt(dirfd int, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// futimens sets the times of an open file (utimensat with a NULL path), which
// x/sys/unix does not wrap with nanosecond precision.
func futimens(fd int, ts *[2]unix.Timespec) error {
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func statTimes(st *unix.Stat_t) [2]unix.Timespec {
	return [2]unix.Timespec{st.Atim, st.Mtim}
}

// xattrArgs is the kernel's struct xattr_args (Linux 6.13+).
type xattrArgs struct {
	value uint64
	size  uint32
	flags uint32
}

// The *xattrat syscalls take (dirfd, name, AT_SYMLINK_NOFOLLOW): one name
// component, never followed, for every file type including symlinks and
// device nodes, which have no fd to use f*xattr on. An empty name with
// AT_EMPTY_PATH addresses dirfd itself.

func atFlags(name string) uintptr {
	if name == "" {
		return unix.AT_EMPTY_PATH | unix.AT_SYMLINK_NOFOLLOW
	}
	return unix.AT_SYMLINK_NOFOLLOW
}

func listxattrAt(dirfd int, name string) ([]string, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 256)
	for {
		var bp unsafe.Pointer
		if len(buf) > 0 {
			bp = unsafe.Pointer(&buf[0])
		}
		n, _, e := unix.Syscall6(unix.SYS_LISTXATTRAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), atFlags(name), uintptr(bp), uintptr(len(buf)), 0)
		if e == unix.ERANGE {
			buf = make([]byte, len(buf)*4)
			if len(buf) > 1<<20 {
				return nil, e
			}
			continue
		}
		if e == unix.EOPNOTSUPP {
			return nil, nil
		}
		if e != 0 {
			return nil, e
		}
		var names []string
		for _, b := range bytes.Split(buf[:n], []byte{0}) {
			if len(b) > 0 {
				names = append(names, string(b))
			}
		}
		return names, nil
	}
}

func getxattrAt(dirfd int, name, attr string) ([]byte, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return nil, err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 256)
	for {
		args := xattrArgs{value: uint64(uintptr(unsafe.Pointer(&buf[0]))), size: uint32(len(buf))}
		n, _, e := unix.Syscall6(unix.SYS_GETXATTRAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), atFlags(name),
			uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args))
		if e == unix.ERANGE && len(buf) < 1<<17 {
			buf = make([]byte, len(buf)*8)
			continue
		}
		if e != 0 {
			return nil, e
		}
		return buf[:n:n], nil
	}
}

func setxattrAt(dirfd int, name, attr string, value []byte) error {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return err
	}
	args := xattrArgs{size: uint32(len(value))}
	if len(value) > 0 {
		args.value = uint64(uintptr(unsafe.Pointer(&value[0])))
	}
	_, _, e := unix.Syscall6(unix.SYS_SETXATTRAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), atFlags(name),
		uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args))
	if e != 0 {
		return e
	}
	return nil
}

func removexattrAt(dirfd int, name, attr string) error {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return err
	}
	_, _, e := unix.Syscall6(unix.SYS_REMOVEXATTRAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), atFlags(name), uintptr(unsafe.Pointer(a)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// kind maps an errno to the errdefs kind callers branch on.
func kind(err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return errdefs.ErrUnknown
	}
	switch errno {
	case unix.ENOENT:
		return errdefs.ErrNotFound
	case unix.EEXIST, unix.ENOTEMPTY:
		return errdefs.ErrAlreadyExists
	case unix.EPERM, unix.EACCES, unix.EROFS:
		return errdefs.ErrPermissionDenied
	case unix.ENOSPC, unix.EDQUOT, unix.EMFILE, unix.ENFILE, unix.ENOMEM:
		return errdefs.ErrResourceExhausted
	case unix.EINVAL, unix.ELOOP, unix.EXDEV, unix.ENAMETOOLONG, unix.ENOTDIR, unix.EISDIR:
		// ELOOP and EXDEV are what RESOLVE_NO_SYMLINKS and RESOLVE_BENEATH
		// report for a path that tried to leave: crafted input.
		return errdefs.ErrInvalidArgument
	case unix.ENOSYS, unix.EOPNOTSUPP:
		return errdefs.ErrNotImplemented
	case unix.EINTR:
		return errdefs.ErrAborted
	}
	return errdefs.ErrUnknown
}
