//go:build linux

package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// A paused sandbox (containerd's task Pause: nerdctl pause, ctr task
// pause) has its cgroup frozen, and every branch with it: branch cgroups
// nest under the sandbox's, and a frozen parent keeps its children frozen
// whatever they are set to. Nothing of a branch can then start, answer,
// freeze on its own or die, so a branch operation would wait for the
// resume, and finish after its caller gave up. Instead every operation
// that needs a branch's processes (fork, exec, commit, abort, kill) is
// refused at once while the sandbox's cgroup is frozen, whoever froze it
// (containerd, or runc pause, or a write to its freezer, behind the
// shim's back); the tree answers, showing the sandbox paused; checkpoints
// are the snapshotter's alone and are made as usual. A Pause through this
// shim first waits for the branch operations under way, so that none is
// caught halfway by the freeze.

// pauseDrain bounds how long a Pause waits for the branch operations under
// way before it gives up, unpaused: they take milliseconds, or seconds
// for a large fork.
const pauseDrain = 10 * time.Second

// PausedError is the refusal of a branch operation on a paused sandbox.
func PausedError(sb *Sandbox) error {
	return fmt.Errorf("sandbox %s is paused: resume it first (ctr task resume, nerdctl unpause): %w", sb.id, errdefs.ErrFailedPrecondition)
}

// starts counts the process starts of execs under way outside the
// sandbox's lock, which a Pause waits for too.
type starts struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

func (s *starts) add() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		s.idle = make(chan struct{})
	}
	s.n++
}

func (s *starts) done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n--
	if s.n == 0 {
		close(s.idle)
		s.idle = nil
	}
}

// wait waits until no start is under way, or until deadline.
func (s *starts) wait(deadline time.Time) bool {
	s.mu.Lock()
	idle := s.idle
	s.mu.Unlock()
	if idle == nil {
		return true
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
		return false
	}
}

// lockWithin locks mu unless that takes longer than d; a lock obtained
// after that is released at once.
func lockWithin(mu *sync.Mutex, d time.Duration) bool {
	if mu.TryLock() {
		return true
	}
	locked := make(chan struct{})
	go func() {
		mu.Lock()
		close(locked)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-locked:
		return true
	case <-t.C:
		go func() {
			<-locked
			mu.Unlock()
		}()
		return false
	}
}

// lockDrained takes sb's lock once the branch operations under way are
// done, for a task operation of containerd's (a pause, an update, a
// checkpoint): it waits at most pauseDrain, then refuses, unavailable, as
// the caller (the kubelet) retries, and must not hang behind a stuck
// operation. what names the operation, undone what did not happen.
func lockDrained(sb *Sandbox, what, undone string) error {
	if lockWithin(&sb.mu, pauseDrain) {
		return nil
	}
	return fmt.Errorf("%s: a branch operation under way did not finish within %s; %s, try again: %w", what, pauseDrain, undone, errdefs.ErrUnavailable)
}

// pause runs containerd's Pause of a container (do) once the branch
// operations under way on it are done, holding its lock meanwhile so that
// none starts before its cgroup is frozen; after that they see it frozen
// and are refused. If they do not finish within pauseDrain, the container
// is not paused.
func (c *Service) Pause(ctx context.Context, id string, do func() error) error {
	sb, err := c.Sandbox(id)
	if err != nil {
		return do() // not one of ours to branch: nothing to wait for
	}
	deadline := time.Now().Add(pauseDrain)
	if err := lockDrained(sb, "pause "+id, "not paused"); err != nil {
		return err
	}
	defer sb.mu.Unlock()
	if !sb.starting.wait(deadline) {
		return fmt.Errorf("pause %s: a process start in one of its branches did not finish within %s; not paused, try again: %w", id, pauseDrain, errdefs.ErrUnavailable)
	}
	return do()
}

// resumed wakes the settle loop of a sandbox that was resumed: reconciling
// waits while the sandbox is paused (it may have to kill branches).
func (c *Service) Resumed(ctx context.Context, id string) {
	sb, err := c.Sandbox(id)
	if err != nil {
		return
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.kick != nil && !sb.closed {
		wake(sb.kick)
	}
	log.G(ctx).WithField("sandbox", id).Debug("sandbox resumed: branch operations allowed again")
}

// StatusPaused is the status the tree gives a paused sandbox, and each of
// its branches whose processes run (they are frozen with it).
const StatusPaused = "paused"
