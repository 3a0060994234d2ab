//go:build linux

package overlay

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// SealThreads runs the remounts that seal forked parents, each on an OS
// thread of its own that is woken on the CPU of the fork waiting for it.
//
// Why: a remount read-only reaches its read-only point some 15 us after it
// is issued, then syncs the whole upper filesystem for a few hundred more,
// so the fork must issue it on another thread and carry on once a probe is
// refused. Handed to a goroutine, the remount waits for the Go scheduler to
// wake an idle thread on the other vCPU, which takes 100-160 us on these
// VMs (a halted vCPU is woken through the host). A thread pinned to the
// fork's CPU instead is switched to when the fork yields, and switched
// back from when the remount blocks in its sync: the seal takes 30-45 us
// (median), and no probe runs while the remount checks for writers. Once
// the probe is refused the thread is settled, moved off the fork's CPU to
// finish its sync elsewhere.
//
// Tried and worse: the thread at SCHED_IDLE with the fork sleeping instead
// of yielding, so that it takes the CPU back even from a remount still busy
// in its sync. A timer wake-up costs 30-50 us here, and lone forks were
// 300-500 us against 225-365 us.
type SealThreads struct {
	mu     sync.Mutex
	idle   []*sealThread
	closed bool
}

// maxIdleSealThreads bounds the threads kept between forks: one for each
// fork of a different root running at once.
const maxIdleSealThreads = 4

// SealRun is one remount under way.
type SealRun struct {
	live Live
	// issued is set just before the remount is: until then the thread
	// may still be waiting for a P, which yielding the CPU does not give.
	issued atomic.Bool
	// result is the remount's outcome, sent once.
	result chan error
	// settle is called once the parent is read-only; release once the
	// result has been received.
	settle, release func()
}

// Seal makes the superblock of the overlay mounted at live read-only,
// which reaches every mount of it (the container's own root in its mount
// namespace, and any copy of that namespace).
//
// The remount first checks that no mount of the superblock has a file open
// for writing and from then on refuses every write; then overlayfs makes it
// sync the whole upper filesystem (0.2 ms to several here), which a seal
// does not need. So the remount runs on a seal thread and Seal returns as
// soon as a probe write through live.Target is refused, with the remount
// still running: the caller must call Finish on the run it returns (which
// waits for the rest) and remount nothing of the tree before that. If the
// remount ended first, Seal returns its outcome and no run.
func (p *SealThreads) Seal(ctx context.Context, live Live) (*SealRun, error) {
	run := p.remount(ctx, live)
	probed := false
	for spin := 0; ; spin++ {
		// The seal thread runs on this CPU when this thread yields it, and
		// gives it back once its remount blocks, past the read-only point.
		// One that has not issued the remount soon is waiting for a P,
		// both being busy: yield this one to it.
		switch {
		case spin >= 400:
			time.Sleep(50 * time.Microsecond)
		case !run.issued.Load() && spin >= 4:
			runtime.Gosched()
		default:
			yieldCPU()
		}
		if !run.issued.Load() {
			continue
		}
		select {
		case err := <-run.result:
			run.settle()
			run.release()
			if err != nil && probed && errors.Is(err, errdefs.ErrFailedPrecondition) {
				// The probe itself may have been the writer the remount saw:
				// try once more without it.
				err = Remount(live, true)
			}
			return nil, err
		default:
		}
		if ProbeRefused(live.Target) {
			break
		}
		probed = true
	}
	run.settle()
	return run, nil
}

// Finish waits for the rest of a remount Seal returned early from: past
// the writer check only an I/O error can fail it, and the parent is
// read-only whatever it returns.
func (run *SealRun) Finish() error {
	err := <-run.result
	run.release()
	return err
}

// remount starts remounting live read-only, on a seal thread pinned to the
// caller's CPU when it can, else on a goroutine.
func (p *SealThreads) remount(ctx context.Context, live Live) *SealRun {
	run := &SealRun{live: live, result: make(chan error, 1), settle: func() {}, release: func() {}}
	t, err := p.take()
	if err == nil {
		var cpu int
		if cpu, err = t.start(run); err == nil {
			run.settle = func() { t.settle(cpu) }
			run.release = func() { p.put(t) }
			return run
		}
		t.stop()
		select {
		case <-t.req: // not taken: remount on a goroutine
		default:
			return run // taken by the thread as it stopped, which serves it
		}
	}
	log.G(ctx).WithError(err).Warn("no seal thread: remounting on a goroutine")
	go func() {
		run.issued.Store(true)
		run.result <- Remount(live, true)
	}()
	return run
}

// take returns an idle seal thread, or a new one.
func (p *SealThreads) take() (*sealThread, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		t := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return t, nil
	}
	p.mu.Unlock()
	return newSealThread()
}

// put returns a seal thread whose remount has ended to the idle ones, or
// ends it.
func (p *SealThreads) put(t *sealThread) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < maxIdleSealThreads {
		p.idle = append(p.idle, t)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	t.stop()
}

// Close ends the idle threads; threads still remounting end when put.
func (p *SealThreads) Close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, t := range idle {
		t.stop()
	}
}

// sealThread is one locked OS thread that remounts on request.
type sealThread struct {
	tid   int
	cpus  unix.CPUSet // the CPUs it may run on when not pinned
	wakeR int         // read end of the wake-up pipe, the thread's
	wakeW int         // write end, the fork's
	req   chan *SealRun
	ended chan struct{} // closed when the thread's goroutine returns
}

func newSealThread() (*sealThread, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("make a seal thread's pipe: %w", err)
	}
	t := &sealThread{wakeR: fds[0], wakeW: fds[1], req: make(chan *SealRun, 1), ended: make(chan struct{})}
	tid := make(chan int)
	go func() {
		// Never unlocked: the thread's CPU affinity is changed, so it must
		// end with this goroutine rather than go back to the runtime
		// (which parks it for good instead if it is the main thread).
		runtime.LockOSThread()
		defer func() {
			unix.Close(t.wakeR)
			// A request sent as the thread stopped is still carried out:
			// it was sent before its wake-up, and a wake-up after the
			// close fails (and the fork remounts on a goroutine).
			select {
			case run := <-t.req:
				t.serve(run)
			default:
			}
			close(t.ended)
		}()
		tid <- unix.Gettid()
		var b [1]byte
		for {
			if n, err := unix.Read(t.wakeR, b[:]); n != 1 {
				if err == unix.EINTR {
					continue
				}
				return // the write end was closed: stop
			}
			t.serve(<-t.req)
		}
	}()
	t.tid = <-tid
	if err := unix.SchedGetaffinity(t.tid, &t.cpus); err != nil {
		t.cpus = unix.CPUSet{}
	}
	return t, nil
}

func (t *sealThread) serve(run *SealRun) {
	run.issued.Store(true)
	run.result <- Remount(run.live, true)
}

// start has t carry out run on the calling thread's current CPU, which it
// returns; the caller then yields (yieldCPU) to let it run.
func (t *sealThread) start(run *SealRun) (int, error) {
	cpu, err := currentCPU()
	if err == nil && t.cpus.Count() > 1 {
		var set unix.CPUSet
		set.Set(cpu)
		// Pinning only saves time: a failure costs just that.
		_ = unix.SchedSetaffinity(t.tid, &set)
	}
	t.req <- run
	if _, err := unix.Write(t.wakeW, []byte{1}); err != nil {
		return 0, fmt.Errorf("wake the seal thread: %w", err)
	}
	return cpu, nil
}

// settle moves t off cpu, the fork's, to finish its remount.
func (t *sealThread) settle(cpu int) {
	if t.cpus.Count() <= 1 {
		return
	}
	others := t.cpus
	others.Clear(cpu)
	if others.Count() == 0 {
		others = t.cpus
	}
	_ = unix.SchedSetaffinity(t.tid, &others)
}

func (t *sealThread) stop() { unix.Close(t.wakeW) }

// currentCPU is the CPU the calling thread runs on (getcpu(2)).
func currentCPU() (int, error) {
	var cpu, node uint32
	if _, _, errno := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), uintptr(unsafe.Pointer(&node)), 0); errno != 0 {
		return 0, errno
	}
	return int(cpu), nil
}

// yieldCPU gives the CPU to a runnable thread pinned to it, if any.
func yieldCPU() { _, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
