//go:build linux

package sandbox

// A replacement of a sandbox's processes (a rollback of the sandbox to a
// checkpoint with memory, rollbackroot.go) ends its init and restores
// another under the same task. containerd, nerdctl and the kubelet watch
// that task: the events of the old init's end and of the new one's
// creation are held back, and a Wait for the init waits for the new one.
// If the replacement fails, the old init's exit is published then, as if
// it had just ended.

import (
	"context"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/log"
)

// replacement is a sandbox's replacements of its processes.
type replacement struct {
	gen     uint64        // replacements begun
	running chan struct{} // closed when the one running ends; nil if none runs
	// hold counts the sandbox's own task events to hold back, by topic:
	// the task service sends each once its step is done.
	hold map[string]int
	// exit is the old init's exit, held back; exited is closed when it is.
	exit   *eventstypes.TaskExit
	exited chan struct{}
	// lost is the exit of an init whose replacement failed after its
	// task was deleted from the task service: the shim answers for it.
	lost *eventstypes.TaskExit
}

// beginReplace starts a replacement of sb's processes; end ends it.
func (c *Service) beginReplace(sb *Sandbox) (end func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := &sb.replace
	r.gen++
	r.running = make(chan struct{})
	r.hold = map[string]int{runtime.TaskExitEventTopic: 1}
	r.exit, r.exited, r.lost = nil, make(chan struct{}), nil
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		close(r.running)
		r.running = nil
	}
}

// expect holds back the next event of topic about sb's own task; unexpect
// undoes it when the step that would send it failed.
func (c *Service) expect(sb *Sandbox, topic string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sb.replace.hold == nil {
		sb.replace.hold = map[string]int{}
	}
	sb.replace.hold[topic]++
}

func (c *Service) unexpect(sb *Sandbox, topic string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sb.replace.hold[topic] > 0 {
		sb.replace.hold[topic]--
	}
}

// HoldEvent says whether a task event is one a replacement holds back
// (and keeps the old init's exit, to publish if the replacement fails).
func (c *Service) HoldEvent(ctx context.Context, topic string, event events.Event) bool {
	var id string
	switch e := event.(type) {
	case *eventstypes.TaskExit:
		if e.ID != e.ContainerID {
			return false // an exec's: it did end
		}
		id = e.ContainerID
	case *eventstypes.TaskDelete:
		if e.ID != "" {
			return false
		}
		id = e.ContainerID
	case *eventstypes.TaskCreate:
		id = e.ContainerID
	case *eventstypes.TaskStart:
		id = e.ContainerID
	default:
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sb := c.sandboxes[id]
	if sb == nil || sb.replace.hold[topic] == 0 {
		return false
	}
	sb.replace.hold[topic]--
	if e, ok := event.(*eventstypes.TaskExit); ok && sb.replace.exit == nil {
		sb.replace.exit = e
		close(sb.replace.exited)
	}
	log.G(ctx).WithFields(log.Fields{"sandbox": id, "topic": topic}).Debug("replacing the sandbox's processes: event held back")
	return true
}

// heldExit waits (a bounded while) for the old init's exit event, which
// the task service sends after its Wait returned, and returns it.
func (c *Service) heldExit(sb *Sandbox) *eventstypes.TaskExit {
	c.mu.Lock()
	exited := sb.replace.exited
	c.mu.Unlock()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return sb.replace.exit
}

// replaceFailed ends a failed replacement as the old init's exit (nil:
// none was held back): the sandbox stops (its branch operations end) and
// the exit is published. lost says the task service no longer has the
// task. Called with sb.mu held.
func (c *Service) replaceFailed(ctx context.Context, sb *Sandbox, exit *eventstypes.TaskExit, lost bool) {
	c.mu.Lock()
	sb.replace.hold = nil // nothing more is held back
	if lost {
		sb.replace.lost = exit
	}
	c.mu.Unlock()
	if exit == nil {
		return // nothing ended yet, or its exit is still to come, unheld
	}
	c.exitedLocked(ctx, sb)
	if err := c.publisher.Publish(ctx, runtime.TaskExitEventTopic, exit); err != nil {
		log.G(ctx).WithError(err).WithField("sandbox", sb.id).Error("publish the exit of a sandbox whose replacement failed")
	}
}

// ReplaceGen is the number of replacements of a sandbox's processes
// done, for Replaced: one running does not count yet.
func (c *Service) ReplaceGen(id string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	sb := c.sandboxes[id]
	if sb == nil {
		return 0
	}
	if sb.replace.running != nil {
		return sb.replace.gen - 1
	}
	return sb.replace.gen
}

// Replaced waits for a replacement of the sandbox's processes to end, if
// one runs, and says whether one that succeeded began after gen: then a
// Wait for its init that returned is waited again, on the new init.
func (c *Service) Replaced(ctx context.Context, id string, gen uint64) (bool, error) {
	c.mu.Lock()
	sb := c.sandboxes[id]
	if sb == nil {
		c.mu.Unlock()
		return false, nil
	}
	running := sb.replace.running
	c.mu.Unlock()
	if running != nil {
		select {
		case <-running:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return sb.replace.gen != gen && sb.replace.lost == nil, nil
}

// LostExit is the exit of a sandbox whose replacement failed after its
// task was deleted from the task service, or nil.
func (c *Service) LostExit(id string) *eventstypes.TaskExit {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sb := c.sandboxes[id]; sb != nil {
		return sb.replace.lost
	}
	return nil
}

// Bundle is a sandbox's bundle ("" if this shim has no such sandbox).
func (c *Service) Bundle(id string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sb := c.sandboxes[id]; sb != nil {
		return sb.bundle
	}
	return ""
}
