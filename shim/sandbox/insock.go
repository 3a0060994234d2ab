//go:build linux

package sandbox

// The branch socket inside a sandbox: with the annotation
// io.branchbox.socket=true on its container, each branch of the sandbox
// (the sandbox itself and every branch) gets a socket of its own, served by
// this shim and bind-mounted read-only into that branch at
// /run/branchbox/branch.sock. The listener a connection arrives on is what
// names the caller's branch (no request names a sandbox), and every
// branch id a request carries must be that branch or one of its
// descendants. The peer's cgroup is checked as well, in case a socket is
// ever reachable from elsewhere.

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/internal/fifoio"
	"github.com/branchbox/branchbox/shim/cgroup"
)

const (
	// SocketAnnotation on a sandbox's container turns its sockets on.
	SocketAnnotation = "io.branchbox.socket"
	// SelfSocketDir is where a branch sees its socket's directory.
	SelfSocketDir = "/run/branchbox"
	// SelfSocketName is the socket's name in that directory.
	SelfSocketName = "branch.sock"

	// selfDir is the socket's directory in a branch's bundle.
	selfDir = "selfsock"
	// selfExecMax bounds the processes started through the sockets of one
	// sandbox and not yet waited for, since the shim keeps their output
	// (selfoutput.go).
	selfExecMax = 256
	// criContainerType is how CRI marks its pause container, which gets no
	// socket: nothing in it would use one.
	criContainerType = "io.kubernetes.cri.container-type"
)

// selfSocks is the registry of the sockets this shim serves and of the
// processes started through them.
type selfSocks struct {
	mu    sync.Mutex
	socks map[string]*selfSock   // by sandbox id and branch id
	execs map[string]*selfExec   // by sandbox id and exec id
	conns map[string]*connBudget // by sandbox id: its sockets' connections
	seq   uint64
}

type selfSock struct {
	dir    string
	server *ttrpc.Server
	conns  *sockConns
}

// selfExec is a process started through a socket: its branch and the
// output the shim keeps for Wait.
type selfExec struct {
	target         string
	pid            uint32
	io             *fifoio.IO
	stdout, stderr *tailBuffer

	mu   sync.Mutex
	exit *shimv1.WaitResponse // its exit, once waited for
}

// release gives the memory of its output back to the sandbox's budget.
func (e *selfExec) release() {
	e.stdout.release()
	e.stderr.release()
}

func selfKey(sandbox, id string) string { return sandbox + "/" + id }

// SocketEnabled reports whether a spec asks for branch sockets.
func SocketEnabled(s *specs.Spec) bool {
	return s != nil && s.Annotations[SocketAnnotation] == "true" && s.Annotations[criContainerType] != "sandbox"
}

// ListenSelfRoot sets up the socket of a sandbox being created, when its
// spec asks for one: the listener, and the bind mount in its bundle's spec.
func (c *Service) ListenSelfRoot(ctx context.Context, id, bundle string) error {
	spec, err := ReadSpec(bundle)
	if err != nil || !SocketEnabled(spec) {
		return nil // a broken spec is the task service's to report
	}
	if spec.Linux == nil {
		return fmt.Errorf("%s: %s needs a linux section in the spec: %w", id, SocketAnnotation, errdefs.ErrInvalidArgument)
	}
	cg, err := cgroup.SandboxPath(spec.Linux.CgroupsPath)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", id, SocketAnnotation, err)
	}
	if err := c.listenSelf(ctx, id, branch.RootID, bundle, cg, spec); err != nil {
		return err
	}
	if err := writeSpec(bundle, spec); err != nil {
		c.closeSelf(id, branch.RootID)
		return fmt.Errorf("%s: write spec with the branch socket's mount: %w", id, err)
	}
	return nil
}

// listenSelfBranch gives a branch being started its own socket, in place
// of the one its spec inherited from its parent, if the sandbox has them.
func (c *Service) listenSelfBranch(ctx context.Context, sb *Sandbox, n *Branch) error {
	c.insock.mu.Lock()
	_, on := c.insock.socks[selfKey(sb.id, branch.RootID)]
	c.insock.mu.Unlock()
	if !on {
		return nil
	}
	return c.listenSelf(ctx, sb.id, n.id, n.bundle, n.cgroup, n.spec)
}

// listenSelf makes <bundle>/selfsock/branch.sock, serves the branch's API
// on it, and mounts the directory read-only at /run/branchbox in spec.
func (c *Service) listenSelf(ctx context.Context, sandboxID, id, bundle, cgroup string, spec *specs.Spec) (retErr error) {
	dir := filepath.Join(bundle, selfDir)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("branch %s/%s: clear socket directory: %w", sandboxID, id, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("branch %s/%s: make socket directory: %w", sandboxID, id, err)
	}
	defer func() {
		if retErr != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	uid, gid := socketOwner(spec)
	l, err := listenIn(dir, SelfSocketName, uid, gid)
	if err != nil {
		return fmt.Errorf("branch %s/%s: listen on its branch socket: %w", sandboxID, id, err)
	}
	conns, budget := newSockConns(), c.connBudget(sandboxID)
	server, err := ttrpc.NewServer(ttrpc.WithServerHandshaker(countingHandshaker{inner: ttrpc.UnixCredentialsFunc(func(uc *unix.Ucred) error {
		return peerIn(int(uc.Pid), cgroup)
	}), conns: conns, budget: budget, sandbox: sandboxID}), ttrpc.WithUnaryServerInterceptor(c.guardCalls(sandboxID, budget)))
	if err != nil {
		l.Close()
		return err
	}
	shimv1.RegisterSelfService(server, &selfService{c: c, sandbox: sandboxID, self: id})

	var mounts []specs.Mount
	for _, m := range spec.Mounts {
		if filepath.Clean(m.Destination) != SelfSocketDir {
			mounts = append(mounts, m)
		}
	}
	spec.Mounts = append(mounts, specs.Mount{
		Destination: SelfSocketDir, Type: "bind", Source: dir,
		Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"},
	})

	c.insock.mu.Lock()
	if c.insock.socks == nil {
		c.insock.socks = map[string]*selfSock{}
	}
	key := selfKey(sandboxID, id)
	old := c.insock.socks[key]
	c.insock.socks[key] = &selfSock{dir: dir, server: server, conns: conns}
	c.insock.mu.Unlock()
	if old != nil {
		_ = old.server.Close()
	}
	go func() {
		if err := server.Serve(context.WithoutCancel(c.ctx), l); err != nil && err != ttrpc.ErrServerClosed {
			log.G(ctx).WithError(err).WithField("branch", key).Warn("branch socket stopped serving")
		}
	}()
	return nil
}

// listenIn listens on dir/name. The path is taken through a descriptor of
// dir, since a bundle's path can be longer than a socket address may be.
func listenIn(dir, name string, uid, gid int) (*net.UnixListener, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Net: "unix", Name: fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), name)})
	if err != nil {
		return nil, err
	}
	// The file is removed with its directory (closeSelf): the name above
	// means nothing once d is closed.
	l.SetUnlinkOnClose(false)
	// Only the branch's own user (and its root) may connect: what the
	// socket runs, it runs as that user, so another user of the branch
	// must not be able to use it to act as that one.
	p := filepath.Join(dir, name)
	if err := os.Chown(p, uid, gid); err != nil {
		l.Close()
		return nil, err
	}
	if err := os.Chmod(p, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// socketOwner is the branch's process user as the host sees it (through
// the spec's user namespace mappings, if any).
func socketOwner(spec *specs.Spec) (int, int) {
	var uid, gid uint32
	if spec.Process != nil {
		uid, gid = spec.Process.User.UID, spec.Process.User.GID
	}
	if spec.Linux != nil {
		uid = mapID(uid, spec.Linux.UIDMappings)
		gid = mapID(gid, spec.Linux.GIDMappings)
	}
	return int(uid), int(gid)
}

func mapID(id uint32, m []specs.LinuxIDMapping) uint32 {
	for _, r := range m {
		if id >= r.ContainerID && id-r.ContainerID < r.Size {
			return r.HostID + id - r.ContainerID
		}
	}
	return id
}

// closeSelf stops serving a branch's socket, removes it, and drops the
// processes started in that branch through any socket.
func (c *Service) closeSelf(sandboxID, id string) {
	c.insock.mu.Lock()
	key := selfKey(sandboxID, id)
	s := c.insock.socks[key]
	delete(c.insock.socks, key)
	var execs []*selfExec
	for k, e := range c.insock.execs {
		if strings.HasPrefix(k, sandboxID+"/") && e.target == id {
			execs = append(execs, e)
			delete(c.insock.execs, k)
		}
	}
	c.insock.mu.Unlock()
	for _, e := range execs {
		e.io.Cancel()
		e.io.Close()
		e.release()
	}
	if s == nil {
		return
	}
	// Close does not wait for calls in flight: a branch committing itself
	// closes its own socket from within a call on it.
	_ = s.server.Close()
	if err := os.RemoveAll(s.dir); err != nil {
		log.G(c.ctx).WithError(err).WithField("branch", key).Warn("remove branch socket")
	}
}

// guardCalls holds every call through a sandbox's branch sockets to its
// bounds: at most selfCallsMax in flight (one more is refused at once),
// and its call rate.
func (c *Service) guardCalls(sandboxID string, budget *connBudget) ttrpc.UnaryServerInterceptor {
	return func(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (interface{}, error) {
		if !budget.takeCall() {
			return nil, toTTRPC(fmt.Errorf("sandbox %s has %d calls in flight through its branch sockets, its maximum: wait for some to return: %w", sandboxID, selfCallsMax, errdefs.ErrResourceExhausted))
		}
		defer budget.giveCall()
		if sb, err := c.Sandbox(sandboxID); err == nil {
			if err := sb.throttleCall(ctx); err != nil {
				return nil, toTTRPC(err)
			}
		}
		return method(ctx, unmarshal)
	}
}

// connBudget is the count of connections to the sandbox's sockets.
func (c *Service) connBudget(sandboxID string) *connBudget {
	c.insock.mu.Lock()
	defer c.insock.mu.Unlock()
	if c.insock.conns == nil {
		c.insock.conns = map[string]*connBudget{}
	}
	b := c.insock.conns[sandboxID]
	if b == nil {
		b = &connBudget{}
		c.insock.conns[sandboxID] = b
	}
	return b
}

// CloseSelfAll closes every socket of a sandbox (its task is deleted).
func (c *Service) CloseSelfAll(sandboxID string) {
	c.insock.mu.Lock()
	delete(c.insock.conns, sandboxID)
	var ids []string
	for k := range c.insock.socks {
		if id, ok := strings.CutPrefix(k, sandboxID+"/"); ok {
			ids = append(ids, id)
		}
	}
	c.insock.mu.Unlock()
	for _, id := range ids {
		c.closeSelf(sandboxID, id)
	}
}

// peerIn checks that a connecting process belongs to the branch whose
// cgroup is cg: in it (or a leaf of its: .sealed, .leaf on cgroup v2), and not in one of its
// branches' cgroups (b<id>), whose processes have sockets of their own.
func peerIn(pid int, cg string) error {
	paths, err := cgroups.ParseCgroupFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return fmt.Errorf("cgroup of peer %d: %v: %w", pid, err, errdefs.ErrPermissionDenied)
	}
	in := false
	for _, p := range paths {
		rel, ok := strings.CutPrefix(p, cg)
		if !ok || (rel != "" && rel[0] != '/') {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(rel, "/"), "/")
		if isBranchCgroup(first) {
			return fmt.Errorf("peer %d is in branch cgroup %s, not in branch %s: %w", pid, p, cg, errdefs.ErrPermissionDenied)
		}
		in = true
	}
	if !in {
		return fmt.Errorf("peer %d is not in the branch's cgroup %s: %w", pid, cg, errdefs.ErrPermissionDenied)
	}
	return nil
}

func isBranchCgroup(name string) bool {
	if len(name) < 2 || name[0] != 'b' {
		return false
	}
	for _, r := range name[1:] {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
