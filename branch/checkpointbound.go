package branch

import (
	"fmt"

	"github.com/containerd/errdefs"
	units "github.com/docker/go-units"
)

// CheckpointBoundError is a checkpoint refused by the bounds its caller
// gave (CheckpointOptions.MaxCheckpoints, MaxBytes): the root's
// checkpoints, or the bytes they hold, would be more than allowed. It
// wraps errdefs.ErrResourceExhausted. The shim, which knows where the
// bounds came from, words it for the user (docs/limits.md).
type CheckpointBoundError struct {
	// Count checkpoints the root has; MaxCheckpoints the most it may have.
	Count, MaxCheckpoints int
	// Bytes they hold, DeletedBytes of it in deleted checkpoints' layers
	// that later ones build on; NewBytes the refused checkpoint's (0 if it
	// was refused before it was written); MaxBytes the most they may hold.
	Bytes, DeletedBytes, NewBytes, MaxBytes int64
	// Message, when set, is the refusal as worded for the user (by the
	// shim, which knows where the bounds were set); it crosses the wire
	// with the figures, so that a client past the shim still has both.
	Message string
}

// OverCount says whether the count, not the bytes, refused it.
func (e *CheckpointBoundError) OverCount() bool {
	return e.MaxCheckpoints > 0 && e.Count >= e.MaxCheckpoints
}

func (e *CheckpointBoundError) Error() string {
	if e.Message != "" {
		return e.Message
	}
	if e.OverCount() {
		return fmt.Sprintf("%d checkpoints, the most it may have (%d)", e.Count, e.MaxCheckpoints)
	}
	held := Bytes(e.Bytes)
	if e.DeletedBytes > 0 {
		held += fmt.Sprintf(" (%s of it deleted checkpoints' layers that later checkpoints build on)", Bytes(e.DeletedBytes))
	}
	if e.NewBytes > 0 {
		return fmt.Sprintf("its checkpoints hold %s, and this one's %s would take them past the most they may hold (%s)", held, Bytes(e.NewBytes), Bytes(e.MaxBytes))
	}
	return fmt.Sprintf("its checkpoints hold %s, the most they may hold (%s)", held, Bytes(e.MaxBytes))
}

// CheckCheckpointBounds refuses one more checkpoint of newBytes (0: not
// yet written) beside count checkpoints holding bytes (deleted of it in
// deleted checkpoints' layers), where o's bounds do not allow it.
func CheckCheckpointBounds(o CheckpointOptions, count int, bytes, deleted, newBytes int64) error {
	e := &CheckpointBoundError{Count: count, MaxCheckpoints: o.MaxCheckpoints,
		Bytes: bytes, DeletedBytes: deleted, NewBytes: newBytes, MaxBytes: o.MaxBytes}
	if e.OverCount() || (o.MaxBytes > 0 && (bytes >= o.MaxBytes || bytes+newBytes > o.MaxBytes)) {
		return e
	}
	return nil
}

// Unwrap makes errdefs.IsResourceExhausted true for a CheckpointBoundError.
func (e *CheckpointBoundError) Unwrap() error { return errdefs.ErrResourceExhausted }

// Bytes writes a size in binary units, as the bounds are given ("10GiB").
func Bytes(n int64) string { return units.BytesSize(float64(n)) }
