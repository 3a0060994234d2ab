//go:build linux

// Package lockedthread runs code on an OS thread of its own, for work that
// changes the thread itself (its namespaces, cgroups, filesystem
// attributes, CPU affinity).
package lockedthread

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Go runs fn on a new goroutine locked to an OS thread other than the
// process's main thread. fn may unlock the thread before it returns, or
// leave it locked so that the thread ends with the goroutine instead of
// going back to the runtime changed. Never the main thread: it cannot end
// (the runtime parks it for good instead), and it leads the thread group
// (a process's namespaces are its, and in a cgroup it lists the whole
// process), so when the new goroutine lands on it, it holds it while
// another goroutine, which then cannot land there, runs fn.
func Go(fn func()) {
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			fn()
			return
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			fn()
		}()
		<-done
		runtime.UnlockOSThread()
	}()
}
