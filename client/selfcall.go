//go:build linux

package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/genproto/googleapis/rpc/status"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/branchbox/branchbox/branch"
)

const (
	// selfCallPoll is how often a caller looks for its call's outcome.
	selfCallPoll = 2 * time.Millisecond
	// selfCallPatience bounds the wait when the caller set no deadline
	// (a shim that died writes no outcome); it starts again in a copy
	// restored later, whose socket directory is another branch's.
	selfCallPatience = 10 * time.Minute
)

// awaitSelfCall is the rest of a call that copies its caller (a memory
// fork or a checkpoint with memory of the caller's own branch): the shim
// makes it only once the caller holds no connection to it, which a copy
// could not be given, so the connection is closed, the outcome read from
// the socket's directory, where the shim writes it, and the connection
// opened again. It returns as often as the caller is restored: in the
// caller with the call's response decoded into resp, and in each copy
// (whose socket directory is its own branch's) with copied true.
func (s *SelfClient) awaitSelfCall(ctx context.Context, token string, resp proto.Message) (copied bool, _ error) {
	_ = s.conn.Close()
	dir := filepath.Dir(s.path)
	path := filepath.Join(dir, branch.SelfCallOutcomeFile(token))
	first, _ := os.Stat(dir)
	since := time.Now()
	var data []byte
	for {
		// Only stats while the call may be dumping this process: no
		// descriptor of the socket's directory is held.
		if _, err := os.Stat(path); err == nil {
			if data, err = os.ReadFile(path); err != nil {
				return false, fmt.Errorf("read the outcome of the call: %w", err)
			}
			break
		}
		if now, err := os.Stat(dir); err == nil && first != nil && !os.SameFile(first, now) {
			first, since = now, time.Now() // restored into another branch
		}
		if _, ok := ctx.Deadline(); !ok && time.Since(since) > selfCallPatience {
			return false, fmt.Errorf("gave up waiting %s for the outcome of the call (it may still be made; see branchctl self tree): %w", selfCallPatience, errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("gave up waiting for the outcome of the call (it may still be made; see branchctl self tree): %w", ctx.Err())
		case <-time.After(selfCallPoll):
		}
	}
	var out branch.SelfCallOutcome
	if err := json.Unmarshal(data, &out); err != nil {
		return false, fmt.Errorf("the outcome of the call: %v: %w", err, errdefs.ErrUnknown)
	}
	// Connected again: in a copy, to its own branch's socket.
	if err := s.dial(ctx); err != nil {
		return false, err
	}
	switch {
	case out.Self != "":
		return true, nil
	case out.Error != nil:
		var st status.Status
		if err := protojson.Unmarshal(out.Error, &st); err != nil {
			return false, fmt.Errorf("the error of the call: %v: %w", err, errdefs.ErrUnknown)
		}
		return false, fromTTRPC(grpcstatus.FromProto(&st).Err())
	case out.Response != nil:
		if err := protojson.Unmarshal(out.Response, resp); err != nil {
			return false, fmt.Errorf("the response of the call: %v: %w", err, errdefs.ErrUnknown)
		}
		return false, nil
	}
	return false, errors.New("an empty outcome of the call")
}
