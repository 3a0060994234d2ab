//go:build linux

package ops

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/lockedthread"
)

// A branch's files include those of /proc, /sys and the kernel's other
// filesystems mounted in its mount namespace. Their size says nothing (0
// in /proc, 4096 for any attribute of sysfs), their content is made by
// the read and some wait for content that may never come (/proc/kmsg),
// and opening them is checked against the opener's capabilities
// (/proc/kmsg needs CAP_SYSLOG, /proc/kallsyms shows addresses only with
// it, /proc/PID/mem needs ptrace access). The server runs as the node's
// root, so they are opened with the capabilities root has in the sandbox
// (Root.caps) and read without waiting, to a bound.

// Filesystems' magic numbers golang.org/x/sys/unix does not name
// (linux/magic.h).
const (
	configfsMagic = 0x62656570
	fusectlMagic  = 0x65735543
)

// pseudoFS is whether the file open at fd is on one of the kernel's own
// filesystems, not one that stores what was written.
func pseudoFS(fd int) bool {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return false
	}
	switch uint32(st.Type) {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC,
		unix.DEBUGFS_MAGIC, unix.TRACEFS_MAGIC, unix.SECURITYFS_MAGIC, unix.BPF_FS_MAGIC,
		unix.PSTOREFS_MAGIC, unix.EFIVARFS_MAGIC, unix.SELINUX_MAGIC, unix.SMACK_MAGIC,
		unix.NSFS_MAGIC, unix.BINFMTFS_MAGIC, configfsMagic, fusectlMagic:
		return true
	}
	return false
}

// withCaps runs open on a thread of its own (lockedthread) as root of the
// sandbox: its effective capabilities lowered to root.caps, and, for a
// sandbox with a user namespace of its own, its filesystem ids set to
// root's on the node (so that its processes' /proc files, which a process
// of their user may read, open); then raises them again. Credentials are
// a thread's: no other goroutine runs on the thread meanwhile, and a
// thread whose credentials could not be brought back stays locked, so that
// it ends with its goroutine rather than serve another.
func withCaps(root *Root, open func() (int, error)) (fd int, err error) {
	done := make(chan struct{})
	lockedthread.Go(func() {
		defer close(done)
		fd, err = -1, nil
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var saved [2]unix.CapUserData
		if cerr := unix.Capget(&hdr, &saved[0]); cerr != nil {
			err = fmt.Errorf("read the server's capabilities: %w", cerr)
			runtime.UnlockOSThread()
			return
		}
		// The ids first, while the thread may (CAP_SETUID, CAP_SETGID);
		// the capabilities lowered after.
		ids := root.uid != 0 || root.gid != 0
		if ids && !setfsIDs(root.uid, root.gid) {
			err = fmt.Errorf("set the thread's filesystem ids to the sandbox root's, %d:%d", root.uid, root.gid)
			return // the thread ends, with whatever ids it has
		}
		lowered := saved
		lowered[0].Effective &= uint32(root.caps)
		lowered[1].Effective &= uint32(root.caps >> 32)
		if cerr := unix.Capset(&hdr, &lowered[0]); cerr != nil {
			err = fmt.Errorf("lower the server's capabilities to the sandbox's: %w", cerr)
			return // the thread ends, with whatever ids it has
		}
		fd, err = open()
		rerr := unix.Capset(&hdr, &saved[0])
		if rerr == nil && ids && !setfsIDs(0, 0) {
			rerr = errors.New("its filesystem ids stay the sandbox's")
		}
		if rerr != nil {
			if fd >= 0 {
				unix.Close(fd)
			}
			fd, err = -1, fmt.Errorf("bring the thread back to the server's credentials: %w", rerr)
			return
		}
		runtime.UnlockOSThread()
	})
	<-done
	return fd, err
}

// setfsIDs sets the thread's filesystem ids, and says whether they are
// set (setfsuid and setfsgid answer with the ids before, not errors).
func setfsIDs(uid, gid int) bool {
	_ = unix.Setfsgid(gid)
	_ = unix.Setfsuid(uid)
	fsgid, _ := unix.SetfsgidRetGid(-1)
	fsuid, _ := unix.SetfsuidRetUid(-1)
	return fsuid == uid && fsgid == gid
}

// ReadAll reads the file from where it is, max bytes at most. A pseudo
// file is read without waiting: what it has now is its content.
func (f *File) ReadAll(max int64) ([]byte, error) {
	if !f.Pseudo {
		data, err := io.ReadAll(io.LimitReader(f.File, max))
		if err != nil {
			return nil, readErr(f.path, err, false)
		}
		return data, nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, readErr(f.path, err, true)
	}
	var data []byte
	for int64(len(data)) < max {
		chunk := make([]byte, min(max-int64(len(data)), 64<<10))
		var n int
		var rerr error
		// Done at once, whatever the read says: the runtime's poller
		// would wait for content (EAGAIN) as long as the file makes
		// none.
		if err := rc.Read(func(fd uintptr) bool {
			n, rerr = unix.Read(int(fd), chunk)
			return true
		}); err != nil {
			return nil, readErr(f.path, err, true)
		}
		switch {
		case rerr == unix.EINTR:
			continue
		case rerr == unix.EAGAIN:
			return data, nil
		case rerr != nil:
			return nil, readErr(f.path, rerr, true)
		case n == 0:
			return data, nil
		}
		data = append(data, chunk[:n]...)
	}
	return data, nil
}

// readErr says what a read's error means.
func readErr(p string, err error, pseudo bool) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("read %s: %w", p, err)
	}
	if pseudo {
		return pseudoErr(p, errno, "gives no content to a read from its start")
	}
	return fileErr(p, errno)
}

// pseudoErr says what an errno on a pseudo file means: the kernel's
// refusal of what the request asked of that file (/proc/PID/mem read at
// 0, /proc/PID/comm written from outside its process, /proc/sys mounted
// read-only in the sandbox) is the request's mistake, not the server's.
func pseudoErr(p string, errno unix.Errno, refused string) error {
	switch errno {
	case unix.EROFS:
		return &PathError{Path: p, err: fmt.Errorf("%s: %v (mounted read-only in the sandbox): %w", p, errno, errdefs.ErrFailedPrecondition)}
	case unix.EIO, unix.EINVAL, unix.EOPNOTSUPP, unix.ENODATA, unix.EFAULT, unix.ENXIO, unix.ENODEV, unix.EBUSY, unix.ERANGE:
		return &PathError{Path: p, err: fmt.Errorf("%s: %v (a file of the kernel that %s): %w", p, errno, refused, errdefs.ErrInvalidArgument)}
	}
	return fileErr(p, errno)
}

// File is a branch's regular file, open.
type File struct {
	*os.File
	Info os.FileInfo
	// Pseudo is whether the file is one of the kernel's (pseudoFS): its
	// size says nothing, its content is read whole (ReadAll).
	Pseudo bool
	path   string
}
