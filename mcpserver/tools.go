//go:build linux

package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/ops"
)

// ForkIn is fork's input.
type ForkIn struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"the sandbox (id, id prefix or name); default: the one this server is scoped to"`
	Parent  string `json:"parent,omitempty" jsonschema:"the branch to fork: \"0\" (default) for the sandbox itself, or a live branch id (nested branches)"`
	Count   int    `json:"count,omitempty" jsonschema:"how many branches to make, 1 (default) to 64"`
	From    string `json:"from_checkpoint,omitempty" jsonschema:"fork from this checkpoint of the parent instead of its current state"`
	Seal    string `json:"seal,omitempty" jsonschema:"how the parent is held while it has branches: ro (default; its files read-only) or freeze (its processes frozen too)"`
	Net     string `json:"net,omitempty" jsonschema:"network: shared (default; the parent's) or isolated (loopback only)"`
	Memory  bool   `json:"with_memory,omitempty" jsonschema:"fork the running processes too: each branch's continue from the parent's state (or from_checkpoint's, if it was taken with memory)"`
}

// Branch is a branch as the tools show it.
type Branch struct {
	ID     string `json:"id" jsonschema:"the branch's id: \"0\" is the sandbox, others are branches"`
	Parent string `json:"parent,omitempty"`
	State  string `json:"state" jsonschema:"live, committing, committed, aborted or stale"`
	Status string `json:"status,omitempty" jsonschema:"waiting, running, exited, frozen or paused"`
	Sealed bool   `json:"sealed" jsonschema:"read-only (or frozen) while it has live branches"`
	Winner string `json:"winner,omitempty" jsonschema:"for a stale branch, the sibling whose commit won"`
	Procs  int    `json:"processes"`
}

func branchOf(c client.BranchInfo) Branch {
	return Branch{ID: c.ID, Parent: c.Parent, State: string(c.State), Status: c.Status, Sealed: c.Sealed, Winner: c.Winner, Procs: len(c.Pids)}
}

// ForkOut is fork's output.
type ForkOut struct {
	Branches []Branch `json:"branches"`
}

// FileIn names a file or directory.
type FileIn struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"the sandbox (id, id prefix or name); default: the one this server is scoped to"`
	Branch  string `json:"branch" jsonschema:"the branch: a branch id, or \"0\" for the sandbox itself"`
	Path    string `json:"path" jsonschema:"an absolute path in the branch"`
}

// ReadOut is read_file's output.
type ReadOut struct {
	Path      string `json:"path"`
	Size      int64  `json:"size"`
	Encoding  string `json:"encoding" jsonschema:"utf-8, or base64 for a file that is not text"`
	Content   string `json:"content"`
	Truncated bool   `json:"truncated,omitempty"`
}

// WriteIn is write_file's input.
type WriteIn struct {
	Sandbox  string `json:"sandbox,omitempty" jsonschema:"the sandbox (id, id prefix or name); default: the one this server is scoped to"`
	Branch   string `json:"branch" jsonschema:"the branch: a branch id, or \"0\" for the sandbox itself (read-only while it has live branches)"`
	Path     string `json:"path" jsonschema:"an absolute path; its directory must exist"`
	Content  string `json:"content" jsonschema:"the file's whole new content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (default) or base64"`
	Mode     string `json:"mode,omitempty" jsonschema:"octal permission bits for a new file, such as 0755 (default 0644)"`
}

// WriteOut is write_file's output.
type WriteOut struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// ListOut is list_dir's output.
type ListOut struct {
	Path    string         `json:"path"`
	Entries []ops.DirEntry `json:"entries"`
}

// BranchIn names a branch.
type BranchIn struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"the sandbox (id, id prefix or name); default: the one this server is scoped to"`
	Branch  string `json:"branch" jsonschema:"the branch id (from fork or tree)"`
}

// LogsOut is logs' output.
type LogsOut struct {
	Output    string `json:"output" jsonschema:"what the branch's processes wrote to stdout and stderr, as text (bytes that are not UTF-8 become U+FFFD)"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"the output was longer than the server returns; only its end is here"`
}

// CommitOut is commit's output.
type CommitOut struct {
	Parent      Branch   `json:"parent" jsonschema:"the parent, which now has the branch's changes"`
	Invalidated []string `json:"invalidated" jsonschema:"the siblings this commit made stale (their processes killed)"`
}

// AbortOut is abort's output.
type AbortOut struct {
	Aborted []string `json:"aborted"`
}

// SandboxIn names a sandbox.
type SandboxIn struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"the sandbox (id, id prefix or name); default: the one this server is scoped to"`
}

// TreeOut is tree's output. Contexts, CheckpointOut's and RollbackOut's
// Context are the keys' names before a node of the tree was called a
// branch, kept with the same values for the clients built before the
// rename (deprecated: docs/design.md#names).
type TreeOut struct {
	Branches []Branch `json:"branches"`
	Contexts []Branch `json:"contexts" jsonschema:"deprecated: the same as branches, under the key's old name; removed in the release after next"`
}

// CheckpointIn names a checkpoint of a branch.
type CheckpointIn struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"the sandbox (id, id prefix or name); default: the one this server is scoped to"`
	Branch  string `json:"branch,omitempty" jsonschema:"the branch: \"0\" (default) for the sandbox, or a branch id"`
	Name    string `json:"name" jsonschema:"the checkpoint's name"`
	Memory  bool   `json:"with_memory,omitempty" jsonschema:"record the branch's running processes too, to fork from with with_memory"`
}

// CheckpointOut is checkpoint's output.
type CheckpointOut struct {
	Name    string `json:"name"`
	Branch  string `json:"branch"`
	Context string `json:"context" jsonschema:"deprecated: the same as branch, under the key's old name; removed in the release after next"`
	Size    int64  `json:"size" jsonschema:"bytes of change since the branch's previous checkpoint"`
}

// ListCheckpointsOut is list_checkpoints' output.
type ListCheckpointsOut struct {
	Checkpoints []CheckpointInfo `json:"checkpoints"`
}

// CheckpointInfo is one checkpoint of the sandbox.
type CheckpointInfo struct {
	Name        string    `json:"name"`
	Branch      string    `json:"branch" jsonschema:"the branch it is of (\"0\": the sandbox)"`
	Size        int64     `json:"size" jsonschema:"bytes of change since the branch's previous checkpoint"`
	MemoryBytes int64     `json:"memory_bytes,omitempty" jsonschema:"bytes of its processes' memory image, if taken with_memory"`
	Created     time.Time `json:"created"`
}

// DeleteCheckpointIn names a checkpoint to delete.
type DeleteCheckpointIn struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"the sandbox (id, id prefix or name); default: the one this server is scoped to"`
	Name    string `json:"name" jsonschema:"the checkpoint's name"`
}

// DeleteCheckpointOut is delete_checkpoint's output.
type DeleteCheckpointOut struct {
	Deleted string `json:"deleted"`
}

// RollbackOut is rollback's output.
type RollbackOut struct {
	Branch     string `json:"branch"`
	Context    string `json:"context" jsonschema:"deprecated: the same as branch, under the key's old name; removed in the release after next"`
	Checkpoint string `json:"checkpoint"`
}

// ListSandboxesOut is list_sandboxes' output.
type ListSandboxesOut struct {
	Sandboxes []client.SandboxSummary `json:"sandboxes"`
}

// tool adds a tool whose errors are made actionable.
func tool[In, Out any](s *Server, name, desc string, h func(context.Context, In) (Out, error)) {
	mcp.AddTool(s.mcp, &mcp.Tool{Name: name, Description: desc}, func(ctx context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		// Counted for Close to wait for: a fork whose call the stop
		// cut short aborts what it made (client.SandboxClient.Fork)
		// before the server exits.
		done, err := s.startCommand()
		if err != nil {
			var zero Out
			return nil, zero, actionable(err)
		}
		defer done()
		out, err := h(ctx, in)
		return nil, out, actionable(err)
	})
}

func (s *Server) addTools() {
	tool(s, "fork", "Fork a running sandbox, or one of its branches, into count copy-on-write branches, each with its own files and processes. The parent is read-only while it has live branches. Returns the new branch ids.", s.fork)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "exec", Description: "Run a command in a branch (\"0\": the sandbox itself) and wait for it: its exit code, stdout and stderr. " +
		"A call that carries a progressToken gets a progress notification every second while the command runs."},
		func(ctx context.Context, req *mcp.CallToolRequest, in ExecIn) (*mcp.CallToolResult, ExecOut, error) {
			out, err := s.exec(ctx, in, progressOf(req))
			return nil, out, actionable(err)
		})
	tool(s, "read_file", "Read a file of a branch, as its processes see it.", s.readFile)
	tool(s, "write_file", "Write (replace or create) a file in a branch, whole: readers see the old content or the new, never part. A branch with live branches is read-only.", s.writeFile)
	tool(s, "list_dir", "List a directory of a branch.", s.listDir)
	tool(s, "commit", "Commit a branch: its changes become its parent's. The first commit among siblings wins; the others become stale and their processes are killed.", s.commit)
	tool(s, "abort", "Abort a branch: kill its processes and discard its changes (and its own branches').", s.abort)
	tool(s, "logs", "What a memory branch's processes (fork with_memory) wrote to their stdout and stderr: the end of it, kept by the shim until the branch ends.", s.logs)
	tool(s, "tree", "Every branch of the sandbox: id, parent, state (live, committed, aborted, stale), status, whether sealed.", s.tree)
	tool(s, "checkpoint", "Record a branch's files as a named checkpoint, to roll back to or fork from later.", s.checkpoint)
	tool(s, "rollback", "Bring a branch's files back to a checkpoint, under its running processes.", s.rollback)
	tool(s, "list_checkpoints", "The sandbox's checkpoints, of all its branches: name, branch, size, when taken. A sandbox may keep only so many, holding only so many bytes.", s.listCheckpoints)
	tool(s, "delete_checkpoint", "Delete a checkpoint no longer needed, making room for more (one a live branch was forked from cannot be deleted).", s.deleteCheckpoint)
	if s.cfg.Sandbox == "" {
		tool(s, "list_sandboxes", "The sandboxes of the namespace: id, name, status, live branches.", s.listSandboxes)
	}
}

func (s *Server) fork(ctx context.Context, in ForkIn) (ForkOut, error) {
	sc, err := s.dial(ctx, in.Sandbox)
	if err != nil {
		return ForkOut{}, err
	}
	defer sc.Close()
	if in.Count == 0 {
		in.Count = 1
	}
	parent := in.Parent
	if parent == branch.RootID {
		parent = ""
	}
	kids, err := sc.Fork(ctx, client.ForkOptions{Parent: parent, Count: in.Count, From: in.From, Seal: in.Seal, Net: in.Net, WithMemory: in.Memory})
	if err != nil {
		return ForkOut{}, err
	}
	out := ForkOut{Branches: []Branch{}}
	for _, k := range kids {
		out.Branches = append(out.Branches, branchOf(k))
	}
	return out, nil
}

// openRoot opens the root of a branch for a file tool, and checks the
// path.
func (s *Server) openRoot(ctx context.Context, sandbox, id, path string) (*ops.Root, string, error) {
	p, err := ops.CheckPath(path)
	if err != nil {
		return nil, "", err
	}
	sc, err := s.dial(ctx, sandbox)
	if err != nil {
		return nil, "", err
	}
	defer sc.Close()
	root, err := ops.OpenRoot(ctx, s.cc, sc, id)
	return root, p, err
}

func (s *Server) readFile(ctx context.Context, in FileIn) (ReadOut, error) {
	root, p, err := s.openRoot(ctx, in.Sandbox, in.Branch, in.Path)
	if err != nil {
		return ReadOut{}, err
	}
	defer root.Close()
	f, err := ops.OpenFile(root, p)
	if err != nil {
		return ReadOut{}, err
	}
	defer f.Close()
	data, err := f.ReadAll(s.cfg.MaxFile + 1)
	if err != nil {
		return ReadOut{}, err
	}
	size := f.Info.Size()
	if f.Pseudo {
		size = int64(len(data)) // its own says nothing; more than MaxFile if truncated
	}
	data = data[:min(int64(len(data)), s.cfg.MaxFile)]
	out := ReadOut{Path: p, Size: size, Encoding: "utf-8", Content: string(data), Truncated: size > int64(len(data))}
	if !utf8.Valid(data) {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(data)
	}
	return out, nil
}

func (s *Server) writeFile(ctx context.Context, in WriteIn) (WriteOut, error) {
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "utf-8":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return WriteOut{}, fmt.Errorf("content is not base64: %v: %w", err, errdefs.ErrInvalidArgument)
		}
	default:
		return WriteOut{}, fmt.Errorf("encoding %q: want utf-8 or base64: %w", in.Encoding, errdefs.ErrInvalidArgument)
	}
	if int64(len(data)) > s.cfg.MaxFile {
		return WriteOut{}, fmt.Errorf("%d bytes is over this server's limit of %d per file: %w", len(data), s.cfg.MaxFile, errdefs.ErrResourceExhausted)
	}
	mode := uint32(0o644)
	if in.Mode != "" {
		var m uint32
		if _, err := fmt.Sscanf(in.Mode, "%o", &m); err != nil || m > 0o7777 {
			return WriteOut{}, fmt.Errorf("mode %q: want octal permission bits such as 0755: %w", in.Mode, errdefs.ErrInvalidArgument)
		}
		mode = m
	}
	root, p, err := s.openRoot(ctx, in.Sandbox, in.Branch, in.Path)
	if err != nil {
		return WriteOut{}, err
	}
	defer root.Close()
	n, err := ops.WriteFile(root, p, bytes.NewReader(data), mode)
	if err != nil {
		return WriteOut{}, err
	}
	return WriteOut{Path: p, Size: n}, nil
}

func (s *Server) listDir(ctx context.Context, in FileIn) (ListOut, error) {
	root, p, err := s.openRoot(ctx, in.Sandbox, in.Branch, in.Path)
	if err != nil {
		return ListOut{}, err
	}
	defer root.Close()
	entries, err := ops.ListDir(root, p, 1000)
	if err != nil {
		return ListOut{}, err
	}
	return ListOut{Path: p, Entries: entries}, nil
}

func (s *Server) commit(ctx context.Context, in BranchIn) (CommitOut, error) {
	sc, err := s.dial(ctx, in.Sandbox)
	if err != nil {
		return CommitOut{}, err
	}
	defer sc.Close()
	res, err := sc.Commit(ctx, in.Branch)
	if err != nil {
		return CommitOut{}, err
	}
	out := CommitOut{Parent: branchOf(res.Parent), Invalidated: res.Invalidated}
	if out.Invalidated == nil {
		out.Invalidated = []string{}
	}
	return out, nil
}

func (s *Server) abort(ctx context.Context, in BranchIn) (AbortOut, error) {
	sc, err := s.dial(ctx, in.Sandbox)
	if err != nil {
		return AbortOut{}, err
	}
	defer sc.Close()
	ids, err := sc.Abort(ctx, in.Branch)
	if err != nil {
		return AbortOut{}, err
	}
	if ids == nil {
		ids = []string{}
	}
	return AbortOut{Aborted: ids}, nil
}

func (s *Server) logs(ctx context.Context, in BranchIn) (LogsOut, error) {
	sc, err := s.dial(ctx, in.Sandbox)
	if err != nil {
		return LogsOut{}, err
	}
	defer sc.Close()
	out, err := sc.Output(ctx, in.Branch)
	if err != nil {
		return LogsOut{}, err
	}
	// The end matters most (the last lines a process wrote).
	cut := len(out) > s.cfg.MaxOutput
	if cut {
		out = out[len(out)-s.cfg.MaxOutput:]
	}
	return LogsOut{Output: strings.ToValidUTF8(string(out), "\uFFFD"), Truncated: cut}, nil
}

func (s *Server) tree(ctx context.Context, in SandboxIn) (TreeOut, error) {
	sc, err := s.dial(ctx, in.Sandbox)
	if err != nil {
		return TreeOut{}, err
	}
	defer sc.Close()
	nodes, err := sc.Tree(ctx)
	if err != nil {
		return TreeOut{}, err
	}
	list := []Branch{}
	for _, n := range nodes {
		list = append(list, branchOf(n))
	}
	return TreeOut{Branches: list, Contexts: list}, nil
}

func rootOr(id string) string {
	if id == branch.RootID {
		return ""
	}
	return id
}

func (s *Server) checkpoint(ctx context.Context, in CheckpointIn) (CheckpointOut, error) {
	sc, err := s.dial(ctx, in.Sandbox)
	if err != nil {
		return CheckpointOut{}, err
	}
	defer sc.Close()
	var opts []client.CheckpointOption
	if in.Memory {
		opts = append(opts, client.CheckpointWithMemory())
	}
	ck, err := sc.Checkpoint(ctx, rootOr(in.Branch), in.Name, opts...)
	var be *branch.CheckpointBoundError
	switch {
	case errors.As(err, &be):
		return CheckpointOut{}, &toolError{err: err, kind: client.ErrorKind(err),
			hint: "the sandbox's checkpoints reached a bound (their number or their bytes): call list_checkpoints, then delete_checkpoint for those no longer needed, and checkpoint again"}
	case errdefs.IsResourceExhausted(err):
		return CheckpointOut{}, &toolError{err: err, kind: client.ErrorKind(err),
			hint: "the node has no room for this checkpoint (the message says where): delete_checkpoint those no longer needed may make room; with memory, try without it"}
	}
	if err != nil {
		return CheckpointOut{}, err
	}
	return CheckpointOut{Name: ck.Name, Branch: ck.Branch, Context: ck.Branch, Size: ck.Size}, nil
}

func (s *Server) listCheckpoints(ctx context.Context, in SandboxIn) (ListCheckpointsOut, error) {
	sc, err := s.dial(ctx, in.Sandbox)
	if err != nil {
		return ListCheckpointsOut{}, err
	}
	defer sc.Close()
	list, err := sc.Checkpoints(ctx)
	if err != nil {
		return ListCheckpointsOut{}, err
	}
	out := ListCheckpointsOut{Checkpoints: []CheckpointInfo{}}
	for _, ck := range list {
		out.Checkpoints = append(out.Checkpoints, CheckpointInfo{Name: ck.Name, Branch: ck.Branch, Size: ck.Size, MemoryBytes: ck.MemoryBytes, Created: ck.Created})
	}
	return out, nil
}

func (s *Server) deleteCheckpoint(ctx context.Context, in DeleteCheckpointIn) (DeleteCheckpointOut, error) {
	sc, err := s.dial(ctx, in.Sandbox)
	if err != nil {
		return DeleteCheckpointOut{}, err
	}
	defer sc.Close()
	if err := sc.DeleteCheckpoint(ctx, in.Name); err != nil {
		return DeleteCheckpointOut{}, err
	}
	return DeleteCheckpointOut{Deleted: in.Name}, nil
}

func (s *Server) rollback(ctx context.Context, in CheckpointIn) (RollbackOut, error) {
	sc, err := s.dial(ctx, in.Sandbox)
	if err != nil {
		return RollbackOut{}, err
	}
	defer sc.Close()
	if err := sc.Rollback(ctx, rootOr(in.Branch), in.Name); err != nil {
		return RollbackOut{}, err
	}
	id := in.Branch
	if id == "" {
		id = branch.RootID
	}
	return RollbackOut{Branch: id, Context: id, Checkpoint: in.Name}, nil
}

func (s *Server) listSandboxes(ctx context.Context, _ struct{}) (ListSandboxesOut, error) {
	list, err := client.ListSandboxes(ctx, s.cfg.Address, s.cfg.Namespace)
	if err != nil {
		return ListSandboxesOut{}, err
	}
	if list == nil {
		list = []client.SandboxSummary{}
	}
	return ListSandboxesOut{Sandboxes: list}, nil
}
