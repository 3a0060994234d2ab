//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// sealThreads runs the remounts that seal forked parents, each on an OS
// thread of its own that is woken on the CPU of the fork waiting for it.
//
// Why: a remount read-only reaches its read-only point some 15 us after it
// is issued, then syncs the whole upper filesystem for a few hundred more,
// so the fork must issue it on another thread and carry on once a probe is
// refused. Handed to a goroutine, the remount waits for the Go scheduler to
// wake an idle thread on the other vCPU, which takes 100-160 us on these
// VMs (a halted vCPU is woken through the host). A thread pinned to the
// fork's CPU instead is switched to when the fork yields, and switched
// back from as soon as the remount blocks in its sync: 40 us in all, and
// no probe runs while the remount checks for writers.
type sealThreads struct {
	mu     sync.Mutex
	idle   []*sealThread
	closed bool
}

// maxIdleSealThreads bounds the threads kept between forks: one for each
// fork of a different root running at once.
const maxIdleSealThreads = 4

// sealThread is one locked OS thread that remounts on request.
type sealThread struct {
	tid    int
	wakeR  int // read end of the wake-up pipe, the thread's
	wakeW  int // write end, the fork's
	req    chan liveMountInfo
	result chan error
	ended  chan struct{} // closed when the thread's goroutine returns
}

// remount starts remounting live read-only, on a seal thread pinned to the
// caller's CPU when it can (the caller then yields with yieldCPU), else on
// a goroutine. It returns the remount's outcome, to be received once, and
// what to call after that.
func (p *sealThreads) remount(ctx context.Context, live liveMountInfo) (<-chan error, func()) {
	t, err := p.take()
	if err == nil {
		if err = t.start(live); err == nil {
			return t.result, func() { p.put(t) }
		}
		t.stop()
	}
	log.G(ctx).WithError(err).Warn("no seal thread: remounting on a goroutine")
	result := make(chan error, 1)
	go func() { result <- remountLive(live, true) }()
	return result, func() {}
}

// take returns an idle seal thread, or a new one.
func (p *sealThreads) take() (*sealThread, error) {
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
func (p *sealThreads) put(t *sealThread) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < maxIdleSealThreads {
		p.idle = append(p.idle, t)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	t.stop()
}

// close ends the idle threads; threads still remounting end when put.
func (p *sealThreads) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, t := range idle {
		t.stop()
	}
}

func newSealThread() (*sealThread, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("make a seal thread's pipe: %w", err)
	}
	t := &sealThread{wakeR: fds[0], wakeW: fds[1], req: make(chan liveMountInfo, 1), result: make(chan error, 1), ended: make(chan struct{})}
	tid := make(chan int)
	go func() {
		// Never unlocked: the thread's CPU affinity is changed, so it must
		// end with this goroutine rather than go back to the runtime (the
		// runtime parks it for good instead if it is the main thread).
		runtime.LockOSThread()
		defer close(t.ended)
		defer unix.Close(t.wakeR)
		tid <- unix.Gettid()
		var b [1]byte
		for {
			if n, err := unix.Read(t.wakeR, b[:]); n != 1 {
				if err == unix.EINTR {
					continue
				}
				return // the write end was closed: stop
			}
			live := <-t.req
			t.result <- remountLive(live, true)
		}
	}()
	t.tid = <-tid
	return t, nil
}

// start has t remount live read-only on the calling thread's current CPU.
// The caller then yields (yieldCPU) until the remount is past its
// read-only point, and receives its outcome from t.result.
func (t *sealThread) start(live liveMountInfo) error {
	var set unix.CPUSet
	if cpu, err := currentCPU(); err == nil {
		set.Set(cpu)
		// A pin that fails only costs the wake-up it saves.
		_ = unix.SchedSetaffinity(t.tid, &set)
	}
	t.req <- live
	if _, err := unix.Write(t.wakeW, []byte{1}); err != nil {
		return fmt.Errorf("wake the seal thread: %w", err)
	}
	return nil
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
