//go:build linux

package mcpserver

import (
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/ops"
)

// toolError is what a tool returns on failure: the SDK sends its text as
// the tool's result, with isError set, for the model to read and act on.
type toolError struct {
	err  error
	kind string
	hint string
}

func (e *toolError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "error (kind %s): %v", e.kind, e.err)
	if e.hint != "" {
		fmt.Fprintf(&b, "\nwhat to do: %s", e.hint)
	}
	return b.String()
}

func (e *toolError) Unwrap() error { return e.err }

// actionable gives err its kind and a next step in terms of the tools.
func actionable(err error) error {
	if err == nil {
		return nil
	}
	var te *toolError
	if errors.As(err, &te) {
		return err
	}
	e := &toolError{err: err, kind: client.ErrorKind(err)}
	var se *branch.StaleError
	var pe *ops.PathError
	switch {
	case errors.As(err, &se):
		e.hint = fmt.Sprintf("branch %s lost: branch %s was committed first and its changes are in the parent now; call fork on the parent to explore again, or tree to see the branches", se.Branch, se.Winner)
	case errors.Is(err, client.ErrNoSandbox):
		e.hint = "call list_sandboxes to see the sandboxes this server reaches"
	case errdefs.IsNotFound(err) && errors.As(err, &pe):
		e.hint = "the path does not exist in the branch: call list_dir on its directory"
	case errdefs.IsNotFound(err):
		e.hint = "call tree to see the sandbox's branches (branch ids) and which are live, list_checkpoints its checkpoints; paths must exist (list_dir)"
	case errdefs.IsFailedPrecondition(err) && strings.Contains(err.Error(), "read-only"):
		e.hint = "the branch is sealed while it has live branches: write in a branch instead, or commit or abort its branches first"
	case errdefs.IsFailedPrecondition(err):
		e.hint = "call tree to see the state of the branches; a branch that exited or ended cannot run commands: fork a new one"
	case errdefs.IsInvalidArgument(err):
		e.hint = "check the arguments against the tool's input schema"
	case errdefs.IsResourceExhausted(err):
		e.hint = "a bound was reached: abort branches you no longer need, or wait for running commands to end"
	case errdefs.IsDeadlineExceeded(err):
		e.hint = "the command ran past its timeout and was killed; give a larger timeout_seconds or a quicker command"
	case errdefs.IsPermissionDenied(err):
		e.hint = "this server is scoped to one sandbox or namespace by its command line; work within it"
	}
	return e
}
