//go:build linux

package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/ops"
)

// Error is the body of every error response, as `branchctl --json` prints
// one (docs/branchctl.md#json-output).
type Error struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Hint    string `json:"hint,omitempty"`
}

type errorDoc struct {
	Error Error `json:"error"`
}

// statusOf maps an error kind to an HTTP status; the kind, in the body, is
// what clients act on.
func statusOf(kind string) int {
	switch kind {
	case "not-found":
		return http.StatusNotFound
	case "invalid-argument":
		return http.StatusBadRequest
	case "already-exists", "conflict", "stale", "aborted":
		return http.StatusConflict
	case "failed-precondition":
		return http.StatusPreconditionFailed
	case "unavailable":
		return http.StatusServiceUnavailable
	case "not-implemented":
		return http.StatusNotImplemented
	case "permission-denied":
		return http.StatusForbidden
	case "resource-exhausted":
		return http.StatusTooManyRequests
	case "canceled":
		return 499 // the client went away (nginx's code); nobody reads it
	case "deadline-exceeded":
		return http.StatusGatewayTimeout
	case "data-loss":
		// A damaged archive or blob: the request's data, or what the
		// registry served, cannot be used.
		return http.StatusUnprocessableEntity
	}
	return http.StatusInternalServerError
}

// errorOf turns err into the JSON error, with a hint where its kind
// tells what to do.
func errorOf(err error) Error {
	e := Error{Kind: client.ErrorKind(err), Message: err.Error()}
	var se *branch.StaleError
	var mbe *http.MaxBytesError
	var cbe *branch.CheckpointBoundError
	var pe *ops.PathError
	switch {
	case errors.As(err, &se):
		e.Hint = fmt.Sprintf("branch %s lost to branch %s; fork again from the parent to keep exploring", se.Branch, se.Winner)
	case errors.As(err, &mbe):
		e.Kind = "resource-exhausted"
		e.Hint = fmt.Sprintf("the request body is over this server's limit of %d bytes (branchctl serve --max-body)", mbe.Limit)
	case errors.Is(err, client.ErrNoSandbox):
		e.Hint = "list the namespace's sandboxes with GET /v1/namespaces/{ns}/sandboxes"
	case errdefs.IsNotFound(err) && errors.As(err, &pe):
		e.Hint = "the path does not exist in the branch: list its directory with GET .../dir?path=DIR"
	case errdefs.IsNotFound(err):
		e.Hint = "see the sandbox's branches with GET .../tree and its checkpoints with GET .../checkpoints"
	case errors.As(err, &cbe):
		// The shim's words name branchctl; this client speaks HTTP.
		e.Hint = "the sandbox's checkpoints reached a bound (their number or their bytes): list them with GET .../checkpoints and delete those no longer needed with DELETE .../checkpoints/{name}"
	case errdefs.IsUnauthorized(err):
		e.Kind = "permission-denied"
		e.Hint = "send Authorization: Bearer TOKEN with a token from the server's --token-file"
	}
	return e
}

// writeError writes err as the JSON error document with its status.
func writeError(w http.ResponseWriter, err error) {
	e := errorOf(err)
	status := statusOf(e.Kind)
	if errdefs.IsUnauthorized(err) {
		status = http.StatusUnauthorized
		w.Header().Set("WWW-Authenticate", `Bearer realm="branchbox"`)
	}
	writeJSON(w, status, errorDoc{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
