//go:build linux

package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/containerd/typeurl/v2"
)

// Event is one line of GET .../events: a containerd event of the
// namespace. The shim's branch events (fork, commit, abort, invalidation)
// come on /branch/ topics as ContainerUpdate events, the sandbox's id with
// labels branchbox.parent, .branches, .winner, .epoch (docs/runtime.md).
type Event struct {
	Timestamp time.Time       `json:"timestamp"`
	Namespace string          `json:"namespace"`
	Topic     string          `json:"topic"`
	Event     json.RawMessage `json:"event,omitempty"`
}

// keepAliveEvent is the line an event stream gets after Config.KeepAlive
// without one: an idle connection is what a client's read timeout, or a
// proxy's, ends.
type keepAliveEvent struct {
	KeepAlive bool `json:"keepalive"`
}

// events streams the namespace's containerd events as JSON lines until the
// client leaves; ?topic=/branch/ keeps only topics with that prefix.
func (s *Server) events(w http.ResponseWriter, r request) error {
	prefix := r.URL.Query().Get("topic")
	release, err := s.limits.acquire(r.client, false)
	if err != nil {
		return err
	}
	defer release()
	ctx := r.Context()
	ch, errs := s.cc.EventService().Subscribe(ctx, fmt.Sprintf(`namespace==%q`, r.ns))
	out := newNDJSON(w)
	out.begin()
	stopKeepAlive := out.keepAlive(s.cfg.KeepAlive, func() any { return keepAliveEvent{KeepAlive: true} })
	defer stopKeepAlive()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			if err != nil && ctx.Err() == nil {
				stopKeepAlive() // the error is the last line
				e := errorOf(err)
				_ = out.send(struct {
					Error Error `json:"error"`
				}{e})
			}
			return nil
		case env := <-ch:
			if env == nil || !strings.HasPrefix(env.Topic, prefix) {
				continue
			}
			ev := Event{Timestamp: env.Timestamp, Namespace: env.Namespace, Topic: env.Topic}
			if env.Event != nil {
				if v, err := typeurl.UnmarshalAny(env.Event); err == nil {
					ev.Event, _ = json.Marshal(v)
				}
			}
			if err := out.send(ev); err != nil {
				return nil
			}
		}
	}
}
