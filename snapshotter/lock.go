package snapshotter

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// rootLock is an exclusive flock on <root>/lock. The kernel drops it when the
// holder dies, so a crashed daemon never blocks its successor.
type rootLock struct{ f *os.File }

func lockRoot(root string) (*rootLock, error) {
	path := filepath.Join(root, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := "another process"
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(string(bytes.TrimSpace(b))); perr == nil {
				holder = fmt.Sprintf("process %d", pid)
			}
		}
		f.Close()
		if err == unix.EWOULDBLOCK {
			return nil, fmt.Errorf("snapshotter root %s is in use by %s; stop it or choose another root: %w", root, holder, errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("lock snapshotter root %s: %w", root, err)
	}
	// The pid is only for the message above; the flock is what excludes.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &rootLock{f: f}, nil
}

func (l *rootLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	l.f.Close()
	l.f = nil
}
