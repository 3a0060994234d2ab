//go:build linux

package ops

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/moby/sys/capability"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/client"
)

// Root is a branch's root directory as its processes see it, and what
// its files of /proc, /sys and the kernel's other filesystems are opened
// with: the capabilities root has in the sandbox, not the server's.
type Root struct {
	dir *os.File
	// caps is the effective capability set a pseudo file is opened
	// with (pseudo.go): sandboxCaps.
	caps uint64
	// uid and gid are the node's ids of the sandbox's root (not 0 with a
	// user namespace of its own): a pseudo file is opened as it, and a
	// file the server makes is its.
	uid, gid int
}

// OpenRoot opens the root directory of a branch: "0" (or "") is the
// sandbox's own (its task's init), any other id a branch's init. The pidfd
// taken first, and checked after, makes sure the root opened is that
// process's and not one of a process that reused its pid.
func OpenRoot(ctx context.Context, cc *containerd.Client, sc *client.SandboxClient, id string) (*Root, error) {
	ctx = namespaces.WithNamespace(ctx, sc.Namespace)
	c, err := cc.LoadContainer(ctx, sc.ID)
	if err != nil {
		return nil, err
	}
	pid, err := initPid(ctx, c, sc, id)
	if err != nil {
		return nil, err
	}
	caps := sandboxCaps(ctx, c)
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("branch %s: its init %d is gone: %w", id, pid, errdefs.ErrFailedPrecondition)
	}
	defer unix.Close(pidfd)
	dir, err := os.Open(fmt.Sprintf("/proc/%d/root", pid))
	if err != nil {
		return nil, fmt.Errorf("branch %s: open its root: %w", id, err)
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		dir.Close()
		return nil, fmt.Errorf("branch %s: its init %d ended: %w", id, pid, errdefs.ErrFailedPrecondition)
	}
	uid, gid, err := rootIDs(pid)
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("branch %s: %w", id, err)
	}
	return &Root{dir: dir, caps: caps, uid: uid, gid: gid}, nil
}

// rootIDs are the node's uid and gid of root in the user namespace of
// process pid, from its maps.
func rootIDs(pid int) (uid, gid int, err error) {
	if uid, err = rootID(fmt.Sprintf("/proc/%d/uid_map", pid)); err == nil {
		gid, err = rootID(fmt.Sprintf("/proc/%d/gid_map", pid))
	}
	return uid, gid, err
}

// rootID is the id that 0 maps to in an id map of /proc ("inside outside
// count" lines).
func rootID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read its init's %s: %w", path, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var inside, outside, count int64
		if n, _ := fmt.Sscan(line, &inside, &outside, &count); n == 3 && inside == 0 && count > 0 {
			return int(outside), nil
		}
	}
	return 0, fmt.Errorf("its init's %s maps no root: %w", path, errdefs.ErrFailedPrecondition)
}

// Close closes the root directory.
func (r *Root) Close() error { return r.dir.Close() }

// sandboxCaps is the capability set root has in the sandbox, as the
// server's user namespace counts it: the bounding set of the sandbox's
// spec, which its branches run with too (their inits' own is wider), or
// none if the sandbox has a user namespace of its own. Unreadable: none.
// ctx is in the container's namespace.
func sandboxCaps(ctx context.Context, c containerd.Container) uint64 {
	spec, err := c.Spec(ctx)
	if err != nil || spec.Process == nil || spec.Process.Capabilities == nil {
		return 0
	}
	if spec.Linux != nil && slices.ContainsFunc(spec.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.UserNamespace }) {
		return 0
	}
	var caps uint64
	for _, name := range spec.Process.Capabilities.Bounding {
		for _, c := range capability.ListKnown() {
			if strings.EqualFold(name, "CAP_"+c.String()) {
				caps |= 1 << uint(c)
			}
		}
	}
	return caps
}

// own gives a file the server made to the sandbox's root.
func (r *Root) own(f *os.File) error {
	if r.uid == 0 && r.gid == 0 {
		return nil
	}
	return f.Chown(r.uid, r.gid)
}
