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

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

const (
	// selfForkPoll is how often a caller looks for its memory fork's
	// outcome.
	selfForkPoll = 2 * time.Millisecond
	// selfForkPatience bounds the wait when the caller set no deadline:
	// a shim that died meanwhile writes no outcome.
	selfForkPatience = 10 * time.Minute
)

// awaitSelfFork is the rest of a memory fork of the caller's own context:
// the shim makes it only once the caller holds no connection to it (a copy
// could not be given one), so the connection is closed, the outcome read
// from the socket's directory, where the shim writes it, and the
// connection opened again. It returns twice, as fork(2) does: in the
// caller with the branches, in each copy (whose socket directory is its
// own branch's) with none.
func (s *SelfClient) awaitSelfFork(ctx context.Context, token string) (*shimv1.ForkResponse, error) {
	_ = s.conn.Close()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, selfForkPatience)
		defer cancel()
	}
	path := filepath.Join(filepath.Dir(s.path), branch.SelfForkOutcomeFile(token))
	var data []byte
	for {
		// Only a stat while the fork may be dumping this process: no
		// descriptor of the socket's directory is held.
		if _, err := os.Stat(path); err == nil {
			if data, err = os.ReadFile(path); err != nil {
				return nil, fmt.Errorf("memory fork: read its outcome: %w", err)
			}
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("memory fork: gave up waiting for its outcome (it may still be made; see branchctl self tree): %w", ctx.Err())
		case <-time.After(selfForkPoll):
		}
	}
	var out branch.SelfForkOutcome
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("memory fork: its outcome: %v: %w", err, errdefs.ErrUnknown)
	}
	// Connected again: in a copy, to its own branch's socket.
	if err := s.dial(ctx); err != nil {
		return nil, err
	}
	switch {
	case out.Self != "":
		return &shimv1.ForkResponse{}, nil
	case out.Error != nil:
		var st status.Status
		if err := protojson.Unmarshal(out.Error, &st); err != nil {
			return nil, fmt.Errorf("memory fork: its error: %v: %w", err, errdefs.ErrUnknown)
		}
		return nil, fromTTRPC(grpcstatus.FromProto(&st).Err())
	case out.Response != nil:
		var resp shimv1.ForkResponse
		if err := protojson.Unmarshal(out.Response, &resp); err != nil {
			return nil, fmt.Errorf("memory fork: its branches: %v: %w", err, errdefs.ErrUnknown)
		}
		return &resp, nil
	}
	return nil, errors.New("memory fork: an empty outcome")
}
