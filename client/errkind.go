package client

import (
	"errors"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
)

// ErrorKind names an error's errdefs kind in kebab case, as `branchctl
// --json` and the HTTP API report it: not-found, invalid-argument,
// already-exists, failed-precondition, conflict, unavailable,
// not-implemented, permission-denied, resource-exhausted, aborted,
// canceled, deadline-exceeded, data-loss, unknown, or stale for a branch that lost
// to a sibling's commit. One function, so that every interface agrees.
func ErrorKind(err error) string {
	var se *branch.StaleError
	for _, k := range []struct {
		is   func(error) bool
		name string
	}{
		{func(err error) bool { return errors.As(err, &se) }, "stale"},
		{errdefs.IsNotFound, "not-found"},
		{errdefs.IsInvalidArgument, "invalid-argument"},
		{errdefs.IsAlreadyExists, "already-exists"},
		{errdefs.IsFailedPrecondition, "failed-precondition"},
		{errdefs.IsConflict, "conflict"},
		{errdefs.IsUnavailable, "unavailable"},
		{errdefs.IsNotImplemented, "not-implemented"},
		{errdefs.IsPermissionDenied, "permission-denied"},
		{errdefs.IsResourceExhausted, "resource-exhausted"},
		{errdefs.IsAborted, "aborted"},
		{errdefs.IsCanceled, "canceled"},
		{errdefs.IsDeadlineExceeded, "deadline-exceeded"},
		{errdefs.IsDataLoss, "data-loss"},
	} {
		if k.is(err) {
			return k.name
		}
	}
	return "unknown"
}

// ErrorKinds are every kind ErrorKind returns.
func ErrorKinds() []string {
	return []string{"stale", "not-found", "invalid-argument", "already-exists", "failed-precondition", "conflict",
		"unavailable", "not-implemented", "permission-denied", "resource-exhausted", "aborted", "canceled",
		"deadline-exceeded", "data-loss", "unknown"}
}
