//go:build linux

package overlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/internal/lockedthread"
)

// The per-mount seal: when the superblock's read-only remount is refused
// (the kernel refuses it while the superblock holds a file unlinked while
// open, as after a commit replaced a running binary, not only while a file
// is open for writing), each mount of the overlay is made read-only on its
// own with mount_setattr(MOUNT_ATTR_RDONLY), which the kernel refuses only
// while that mount has writers. The mounts are those of every mount
// namespace: the host's (the live mount the snapshotter finds) and the
// container's own root, in its namespace, entered from a locked thread.

// NSMount is one mount of an overlay superblock in some mount namespace.
type NSMount struct {
	ns       uint64 // the mount namespace (its inode number)
	pid      int    // a process in it; 0 for this process's own
	id       uint64 // the mount's id (mountinfo's first field)
	point    string // its mount point, as pid sees it
	readonly bool   // read-only on its own (per-mount flag)
	major    int    // the superblock's device
	minor    int
}

// MountNS is the inode number of the mount namespace at path (a
// /proc/<pid>/ns/mnt).
func MountNS(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// overlayMountsEverywhere finds every mount, in every mount namespace, of
// the overlay whose upper directory is upper. Other namespaces are found
// from /proc/*/ns/mnt, one process each, and matched by the superblock's
// device, which the host's mount of it gives.
func overlayMountsEverywhere(upper string) ([]NSMount, error) {
	self, err := MountNS("/proc/self/ns/mnt")
	if err != nil {
		return nil, fmt.Errorf("find this process's mount namespace: %w", err)
	}
	own, err := ReadTable()
	if err != nil {
		return nil, err
	}
	var out []NSMount
	for _, m := range own {
		if UpperIs(m, upper) {
			out = append(out, toNSMount(self, 0, m))
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	major, minor := out[0].major, out[0].minor
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	seen := map[uint64]bool{self: true}
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		ns, err := MountNS("/proc/" + name + "/ns/mnt")
		if err != nil || seen[ns] {
			continue // gone, or a kernel thread
		}
		seen[ns] = true
		infos, err := pidOverlayMounts(pid)
		if err != nil {
			continue // gone meanwhile
		}
		for _, m := range infos {
			if m.Major == major && m.Minor == minor {
				out = append(out, toNSMount(ns, pid, m))
			}
		}
	}
	return out, nil
}

func pidOverlayMounts(pid int) ([]*mountinfo.Info, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return mountinfo.GetMountsFromReader(f, mountinfo.FSTypeFilter("overlay"))
}

func toNSMount(ns uint64, pid int, m *mountinfo.Info) NSMount {
	return NSMount{ns: ns, pid: pid, id: uint64(m.ID), point: m.Mountpoint, readonly: hasMountOpt(m.Options, "ro"), major: m.Major, minor: m.Minor}
}

// nsThread is a locked OS thread that enters other mount namespaces: it
// unshares its filesystem attributes first (setns into a mount namespace
// is refused to a thread sharing them), goes back to this process's
// namespace after each use, and ends with its goroutine, so that it never
// goes back to the Go runtime with either changed. It is kept between
// seals: making an OS thread is a fork, which waits, like any, while a
// cgroup migration anywhere on the host waits for an RCU grace period
// (the shim's pool moving a new init: 5-8 ms here), and an unseal right
// after a fork met one.
type nsThread struct {
	req    chan nsRequest
	broken atomic.Bool // it could not go back home: it ended, make another
}

// nsRequest is one call on an nsThread; done gets its result once the
// thread is back home (or broken), so the next call sees broken.
type nsRequest struct {
	f    func() error
	done chan error
}

func newNSThread() (*nsThread, error) {
	t := &nsThread{req: make(chan nsRequest)}
	ready := make(chan error, 1)
	lockedthread.Go(func() { t.run(ready) })
	if err := <-ready; err != nil {
		return nil, err
	}
	return t, nil
}

// run serves t on the calling goroutine's locked thread, never unlocked:
// the thread leaves this process's filesystem attributes, so it ends with
// the goroutine.
func (t *nsThread) run(ready chan<- error) {
	home, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		ready <- fmt.Errorf("open this process's mount namespace: %w", err)
		return
	}
	defer unix.Close(home)
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		ready <- fmt.Errorf("unshare filesystem attributes: %w", err)
		return
	}
	ready <- nil
	for r := range t.req {
		err := r.f()
		if serr := unix.Setns(home, unix.CLONE_NEWNS); serr != nil {
			t.broken.Store(true)
			r.done <- err
			return
		}
		r.done <- err
	}
}

// do runs f on t; the caller (Sealer.inNS) sends no call to a broken t.
func (t *nsThread) do(f func() error) error {
	done := make(chan error, 1)
	t.req <- nsRequest{f: f, done: done}
	return <-done
}

func (t *nsThread) close() {
	if t != nil {
		close(t.req)
	}
}

// Sealer sets or clears the read-only flag of single mounts, in this
// process's mount namespace or (through an nsThread made on first need
// and kept) in another. One serves a snapshotter for its life.
type Sealer struct {
	self   uint64
	mu     sync.Mutex
	thread *nsThread
}

func NewSealer() (*Sealer, error) {
	self, err := MountNS("/proc/self/ns/mnt")
	if err != nil {
		return nil, fmt.Errorf("find this process's mount namespace: %w", err)
	}
	return &Sealer{self: self}, nil
}

// Close ends the sealer's thread.
func (s *Sealer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.thread.close()
	s.thread = nil
}

// inNS runs f on the sealer's thread, made again if the last one ended.
func (s *Sealer) inNS(f func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.thread == nil || s.thread.broken.Load() {
		s.thread.close()
		t, err := newNSThread()
		if err != nil {
			return err
		}
		s.thread = t
	}
	return s.thread.do(f)
}

// set makes mount m read-only (or writable). The mount is opened from this
// namespace, through /proc/<pid>/root for another one, without following
// symbolic links (its path is the container's to change), and must be the
// mount of that id; the flag is then changed from inside its namespace,
// which mount_setattr requires of an attached mount.
func (s *Sealer) set(m NSMount, readonly bool) error {
	attr := &unix.MountAttr{}
	if readonly {
		attr.Attr_set = unix.MOUNT_ATTR_RDONLY
	} else {
		attr.Attr_clr = unix.MOUNT_ATTR_RDONLY
	}
	fd, err := openMount(m)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if m.ns == s.self {
		return unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr)
	}
	nsfd, err := unix.Open("/proc/"+strconv.Itoa(m.pid)+"/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the mount namespace of pid %d: %w", m.pid, err)
	}
	defer unix.Close(nsfd)
	var st unix.Stat_t
	if err := unix.Fstat(nsfd, &st); err != nil || st.Ino != m.ns {
		return fmt.Errorf("pid %d left mount namespace %d: %w", m.pid, m.ns, unix.ESRCH)
	}
	return s.inNS(func() error {
		if err := unix.Setns(nsfd, unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("enter mount namespace %d: %w", m.ns, err)
		}
		return unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr)
	})
}

// openMount opens the root of mount m (O_PATH) and checks its mount id.
func openMount(m NSMount) (int, error) {
	var fd int
	var err error
	if m.pid == 0 {
		fd, err = unix.Openat2(unix.AT_FDCWD, m.point, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	} else {
		root, rerr := unix.Open("/proc/"+strconv.Itoa(m.pid)+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if rerr != nil {
			return -1, fmt.Errorf("open the root of pid %d: %w", m.pid, rerr)
		}
		if m.point == "/" {
			fd = root
		} else {
			fd, err = unix.Openat2(root, m.point, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
			unix.Close(root)
		}
	}
	if err != nil {
		return -1, fmt.Errorf("open mount %s: %w", m.point, err)
	}
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("statx mount %s: %w", m.point, err)
	}
	if stx.Mnt_id != m.id {
		unix.Close(fd)
		return -1, fmt.Errorf("mount %s is mount %d, not %d (moved or covered): %w", m.point, stx.Mnt_id, m.id, unix.ESTALE)
	}
	return fd, nil
}

// WritableMounts lists the mounts of upper's overlay that a per-mount seal
// makes read-only: every mount not read-only of its own (one that is was
// made so by someone else, and stays so) and not covered in its namespace
// (coveredMount).
func WritableMounts(upper string) (all, writable []NSMount, err error) {
	all, err = overlayMountsEverywhere(upper)
	if err != nil {
		return nil, nil, err
	}
	for _, m := range all {
		if !m.readonly && !coveredMount(m) {
			writable = append(writable, m)
		}
	}
	return all, writable, nil
}

// coveredMount says whether m, a mount of another namespace, is one no
// path of its namespace reaches, with no file open for writing through
// it: a copy propagated from the host's shared mounts (systemd makes them
// shared) beneath a mount that covers that place in a namespace of its
// own, as a PrivateTmp= service's /tmp covers the host's. Nothing there
// can open a file through it, so it needs no seal, and it could not be
// given one: mount_setattr needs the mount opened, by its path.
func coveredMount(m NSMount) bool {
	if m.pid == 0 {
		return false
	}
	fd, err := openMount(m)
	if err == nil {
		unix.Close(fd)
		return false
	}
	return errors.Is(err, unix.ENOENT) && stillMounted(m) && len(findWriters([]NSMount{m})) == 0
}

func SealedMounts(ms []NSMount) []branch.SealedMount {
	out := make([]branch.SealedMount, len(ms))
	for i, m := range ms {
		out[i] = branch.SealedMount{NS: m.ns, MountID: m.id, Pid: m.pid}
	}
	return out
}

// SealEach makes each of ms read-only. If one refuses (EBUSY: files are
// open for writing on it), those done are made writable again and the
// error names the writers on every mount of the superblock (all). name is
// the branch, for messages.
func SealEach(ctx context.Context, ms2 *Sealer, name string, all, ms []NSMount) error {
	for i, m := range ms {
		err := ms2.set(m, true)
		if err != nil && !errors.Is(err, unix.EBUSY) && m.pid != 0 && !stillMounted(m) {
			// A namespace that ended, or dropped the mount, meanwhile (a
			// container or branch being set up holds a copy of the host's
			// mounts for a moment): nothing left to seal there.
			log.G(ctx).WithError(err).WithFields(log.Fields{"mount": m.point, "ns": m.ns}).Debug("per-mount seal: mount gone meanwhile")
			continue
		}
		if err != nil {
			for _, d := range ms[:i] {
				if uerr := ms2.set(d, false); uerr != nil {
					log.G(ctx).WithError(uerr).WithField("mount", d.point).Warn("make a mount writable again after a failed seal")
				}
			}
			if errors.Is(err, unix.EBUSY) {
				return &branch.WritersError{Branch: name, Writers: findWriters(all)}
			}
			return fmt.Errorf("make mount %s of %s read-only (namespace %d): %w", m.point, name, m.ns, err)
		}
	}
	return nil
}

// resolveSealed finds the mounts a per-mount seal recorded as they are
// now: each in its namespace (entered through the recorded process, or
// any other of that namespace), by its id, and still of the overlay whose
// upper is upper (an id is reused once its mount is gone). A namespace or
// mount that is gone is left out: nothing is left to unseal there.
func resolveSealed(recorded []branch.SealedMount, upper string) ([]NSMount, error) {
	self, err := MountNS("/proc/self/ns/mnt")
	if err != nil {
		return nil, err
	}
	var pids map[uint64]int // namespace -> a process in it, read on first need
	var out []NSMount
	for _, r := range recorded {
		pid := 0
		if r.NS != self {
			pid = r.Pid
			if ns, err := MountNS("/proc/" + strconv.Itoa(pid) + "/ns/mnt"); err != nil || ns != r.NS {
				if pids == nil {
					pids = namespacePids()
				}
				if pid = pids[r.NS]; pid == 0 {
					continue // the namespace is gone
				}
			}
		}
		var infos []*mountinfo.Info
		if pid == 0 {
			infos, err = ReadTable()
		} else {
			infos, err = pidOverlayMounts(pid)
		}
		if err != nil {
			continue // gone meanwhile
		}
		for _, m := range infos {
			if uint64(m.ID) == r.MountID && UpperIs(m, upper) {
				out = append(out, toNSMount(r.NS, pid, m))
				break
			}
		}
	}
	return out, nil
}

// stillMounted says whether mount m is still in its namespace, as its
// process sees it (a process or namespace gone says no).
func stillMounted(m NSMount) bool {
	if ns, err := MountNS("/proc/" + strconv.Itoa(m.pid) + "/ns/mnt"); err != nil || ns != m.ns {
		return false
	}
	infos, err := pidOverlayMounts(m.pid)
	if err != nil {
		return false
	}
	for _, i := range infos {
		if uint64(i.ID) == m.id {
			return true
		}
	}
	return false
}

// namespacePids maps each mount namespace to one process in it.
func namespacePids() map[uint64]int {
	out := map[uint64]int{}
	d, err := os.Open("/proc")
	if err != nil {
		return out
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		if ns, err := MountNS("/proc/" + name + "/ns/mnt"); err == nil {
			if _, ok := out[ns]; !ok {
				out[ns] = pid
			}
		}
	}
	return out
}

// SetEachRecorded sets the read-only flag of every mount a per-mount seal
// of the overlay whose upper is upper recorded: cleared at unseal, set again at recovery. It goes on past a
// failure and returns them all.
func SetEachRecorded(ctx context.Context, sealer *Sealer, recorded []branch.SealedMount, upper string, readonly bool) error {
	ms, err := resolveSealed(recorded, upper)
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range ms {
		if err := sealer.set(m, readonly); err != nil {
			if m.pid != 0 && !errors.Is(err, unix.EBUSY) && !stillMounted(m) {
				continue // gone meanwhile: nothing to change there
			}
			if readonly && errors.Is(err, unix.EBUSY) {
				err = fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
			}
			errs = append(errs, fmt.Errorf("set mount %s (namespace %d) read-only=%v: %w", m.point, m.ns, readonly, err))
			continue
		}
		log.G(ctx).WithFields(log.Fields{"mount": m.point, "ns": m.ns, "readonly": readonly}).Debug("per-mount seal changed")
	}
	return errors.Join(errs...)
}

func LogSealed(ctx context.Context, name string, ms []NSMount, took time.Duration) {
	log.G(ctx).WithFields(log.Fields{"branch": name, "mounts": len(ms), "took": took}).Debug("sealed mount by mount")
}
