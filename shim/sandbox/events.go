//go:build linux

package sandbox

import (
	"context"
	"strconv"
	"strings"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	runcC "github.com/containerd/go-runc"
	"github.com/containerd/log"
)

// Events: the task service's events, queued and forwarded, and the branch
// events the shim publishes.

type queuedEvent struct {
	ctx   context.Context
	topic string
	ev    *eventstypes.ContainerUpdate
}

type pendingExit struct {
	e  runcC.Exit
	at time.Time
}

// forward publishes queued events in order until the shim's branch ends.
func (c *Service) forward() {
	for {
		select {
		case <-c.ctx.Done():
			return
		case q := <-c.events:
			if err := c.publisher.Publish(q.ctx, q.topic, q.ev); err != nil {
				log.G(q.ctx).WithError(err).WithField("topic", q.topic).Warn("publish branch event")
			}
		}
	}
}

// branchEvent is what a fork, commit, abort or invalidation publishes.
type branchEvent struct {
	Sandbox, Parent string
	Branches        []string
	Winner          string
	Epoch           uint64
}

// publish queues a branch event for containerd's event service. It travels
// as containerd's own ContainerUpdate type (the sandbox's id, and labels
// branchbox.parent, .branches, .winner, .epoch) on a /branch/ topic, so
// that `ctr events` and every containerd client can decode it; a type of
// our own would be skipped by clients that do not link it.
func (c *Service) publish(ctx context.Context, topic string, ev *branchEvent) {
	if c.publisher == nil {
		return
	}
	labels := map[string]string{
		"branchbox.parent":   ev.Parent,
		"branchbox.branches": strings.Join(ev.Branches, ","),
	}
	if ev.Winner != "" {
		labels["branchbox.winner"] = ev.Winner
		labels["branchbox.epoch"] = strconv.FormatUint(ev.Epoch, 10)
	}
	// The request's branch ends with the reply; the event goes after it.
	c.events <- queuedEvent{ctx: context.WithoutCancel(ctx), topic: topic, ev: &eventstypes.ContainerUpdate{ID: ev.Sandbox, Labels: labels}}
}
