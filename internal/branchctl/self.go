//go:build linux

package branchctl

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// selfCommand is branchctl self: the same commands from inside a
// sandbox, on its own branch, through its branch socket.
func selfCommand(inv *invocation) *cli.Command {
	sub := func(name, args, usage string, own ...cli.Flag) *cli.Command {
		return &cli.Command{
			Name: name, ArgsUsage: args, Usage: usage,
			Flags: append([]cli.Flag{
				&cli.StringFlag{Name: "socket", Usage: "the branch socket (default $BRANCHBOX_SOCKET, then /run/branchbox/branch.sock)"},
				&cli.BoolFlag{Name: "json", Usage: "print one JSON document on stdout, also on error"},
				&cli.StringFlag{Name: "branch", Usage: "the branch (default: this one)"},
			}, own...),
			Action: func(c *cli.Context) error {
				code, err := cmdSelf(c, globalsOf(c), inv.stdout, inv.stderr)
				return ran(inv, code, err)
			},
		}
	}
	return &cli.Command{
		Name:     "self",
		Category: "inside a sandbox",
		Usage:    "from inside a sandbox: the same on its own branch, through /run/branchbox/branch.sock",
		Description: `From inside a sandbox run with the annotation io.branchbox.socket=true
(the socket is /run/branchbox/branch.sock). IDs are branch ids as fork and
tree print them; only this branch and what was forked from it can be
named.`,
		Subcommands: []*cli.Command{
			sub("fork", "[-- CMD...]", "fork this branch (or a descendant) into N branches",
				append(forkFlags(), &cli.StringFlag{Name: "parent", Usage: "fork this descendant instead of this branch"})...),
			sub("exec", "ID -- CMD...", "run CMD in descendant ID, print its output, exit with its status; with -d, print its exec id and leave it running (the shim keeps its output, up to 1 MiB per stream, until it is waited for)",
				&cli.BoolFlag{Name: "d", Usage: "print the exec id and do not wait (see wait)"}),
			sub("wait", "ID EXEC", "wait for a process started with exec -d, as exec"),
			sub("commit", "[ID]", "commit descendant ID into its parent; without ID, this branch into its parent: on success every process of this branch is killed, this one too, and nothing is printed"),
			sub("abort", "[ID]", "discard descendant ID (without ID: this branch)"),
			sub("logs", "[ID]", "what descendant ID's command (self fork -- CMD) wrote: its last 1-2 MiB (without ID: this branch's)"),
			sub("tree", "", "this branch and its descendants"),
			sub("checkpoint", "[--branch ID] NAME | ls | rm NAME", "record a branch's rootfs as NAME; ls lists the checkpoints, rm deletes one",
				&cli.BoolFlag{Name: "memory", Usage: "this branch's processes too, this one included: the command returns again, printing nothing, in each copy restored from NAME later (fork --from NAME --memory, rollback)"}),
			sub("rollback", "[--branch ID] NAME", "bring a branch's rootfs back to checkpoint NAME"),
		},
	}
}

func cmdSelf(cc *cli.Context, g globals, stdout, stderr io.Writer) (int, error) {
	ctx, name := cc.Context, cc.Command.Name
	socket, ref, detach := cc.String("socket"), cc.String("branch"), cc.Bool("d")
	pos, cmd := split(cc)
	var err error
	var opts client.ForkOptions
	var memory string
	if name == "fork" {
		opts, memory = forkOptions(cc)
		opts.Parent = cc.String("parent")
	}
	c, err := client.DialSelf(ctx, socket)
	if err != nil {
		return 1, err
	}
	defer c.Close()
	optional := func() (string, error) {
		switch len(pos) {
		case 0:
			return "", nil
		case 1:
			return pos[0], nil
		}
		return "", fmt.Errorf("want at most one branch id, got %v: %w", pos, errdefs.ErrInvalidArgument)
	}
	switch name {
	case "fork":
		if opts.Memory, err = parseBytes(memory); err != nil {
			return 2, err
		}
		opts.Args = cmd
		kids, err := c.Fork(ctx, opts)
		if err != nil {
			return 1, err
		}
		if g.json {
			return 0, PrintJSON(stdout, kids)
		}
		for _, k := range kids {
			fmt.Fprintln(stdout, k.ID)
		}
		return 0, nil
	case "exec":
		id, err := oneArg(pos, "branch id")
		if err != nil {
			return 2, err
		}
		if len(cmd) == 0 {
			return 2, fmt.Errorf("no command: write `branchctl self exec %s -- CMD...`: %w", id, errdefs.ErrInvalidArgument)
		}
		var sigs chan os.Signal
		if !detach {
			sigs = notifyStops()
		}
		execID, err := c.Exec(ctx, id, client.SelfExecOptions{Args: cmd})
		if err != nil {
			if sigs != nil {
				signal.Stop(sigs)
			}
			return 1, err
		}
		if detach {
			if g.json {
				return 0, PrintJSON(stdout, map[string]string{"exec_id": execID})
			}
			fmt.Fprintln(stdout, execID)
			return 0, nil
		}
		defer forwardSignals(ctx, "self exec", selfKill(c, id, execID), sigs, stderr)()
		return printSelfResult(ctx, g, c, id, execID, stdout, stderr)
	case "wait":
		if len(pos) != 2 {
			return 2, fmt.Errorf("want a branch id and an exec id, got %v: %w", pos, errdefs.ErrInvalidArgument)
		}
		defer forwardSignals(ctx, "self wait", selfKill(c, pos[0], pos[1]), notifyStops(), stderr)()
		return printSelfResult(ctx, g, c, pos[0], pos[1], stdout, stderr)
	case "commit":
		id, err := optional()
		if err != nil {
			return 2, err
		}
		res, err := c.Commit(ctx, id)
		if err != nil {
			return 1, err
		}
		if g.json {
			return 0, PrintJSON(stdout, res)
		}
		fmt.Fprintf(stdout, "committed %s into %s (epoch %d)", id, nodeName(res.Parent.ID), res.Parent.Epoch)
		if len(res.Invalidated) > 0 {
			fmt.Fprintf(stdout, "; invalidated %s", strings.Join(res.Invalidated, ", "))
		}
		fmt.Fprintln(stdout)
		return 0, nil
	case "logs":
		id, err := optional()
		if err != nil {
			return 2, err
		}
		out, err := c.Output(ctx, id)
		if err != nil {
			return 1, err
		}
		return 0, printOutput(stdout, g, out)
	case "abort":
		id, err := optional()
		if err != nil {
			return 2, err
		}
		ids, err := c.Abort(ctx, id)
		if err != nil {
			return 1, err
		}
		if g.json {
			return 0, PrintJSON(stdout, map[string][]string{"aborted": ids})
		}
		fmt.Fprintf(stdout, "aborted %s\n", strings.Join(ids, ", "))
		return 0, nil
	case "tree":
		self, nodes, err := c.Tree(ctx)
		if err != nil {
			return 1, err
		}
		if g.json {
			// "contexts": the key's old name (deprecated: docs/design.md#names).
			return 0, PrintJSON(stdout, map[string]any{"self": self, "branches": nodes, "contexts": nodes})
		}
		return 0, printSelfTree(stdout, self, nodes, time.Now())
	case "checkpoint":
		if len(pos) == 1 && pos[0] == "ls" {
			list, err := c.Checkpoints(ctx)
			if err != nil {
				return 1, err
			}
			if g.json {
				return 0, PrintJSON(stdout, list)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tBRANCH\tSIZE")
			for _, ck := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", ck.Name, ck.Branch, size(ck.Size))
			}
			return 0, tw.Flush()
		}
		if len(pos) > 0 && pos[0] == "rm" {
			nm, err := oneArg(pos[1:], "checkpoint name")
			if err != nil {
				return 2, err
			}
			if err := c.DeleteCheckpoint(ctx, nm); err != nil {
				return 1, err
			}
			if g.json {
				return 0, PrintJSON(stdout, map[string]string{"deleted": nm})
			}
			fmt.Fprintf(stdout, "deleted checkpoint %s\n", nm)
			return 0, nil
		}
		nm, err := oneArg(pos, "checkpoint name")
		if err != nil {
			return 2, err
		}
		var opts []client.CheckpointOption
		if cc.Bool("memory") {
			opts = append(opts, client.CheckpointWithMemory())
		}
		ck, err := c.Checkpoint(ctx, ref, nm, opts...)
		if err != nil {
			return 1, err
		}
		if ck.Name == "" {
			// A copy of this process, restored from the checkpoint.
			if g.json {
				return 0, PrintJSON(stdout, nil)
			}
			return 0, nil
		}
		if g.json {
			return 0, PrintJSON(stdout, ck)
		}
		fmt.Fprintf(stdout, "checkpoint %s of %s: %s\n", ck.Name, nodeName(ck.Branch), size(ck.Size))
		return 0, nil
	case "rollback":
		nm, err := oneArg(pos, "checkpoint name")
		if err != nil {
			return 2, err
		}
		if err := c.Rollback(ctx, ref, nm); err != nil {
			return 1, err
		}
		fmt.Fprintf(stdout, "rolled back to %s\n", nm)
		return 0, nil
	}
	return 2, fmt.Errorf("unknown command %q (see `branchctl self help`): %w", name, errdefs.ErrInvalidArgument)
}

// selfKill is KillAll of a process started through the branch socket.
func selfKill(c *client.SelfClient, id, execID string) func(context.Context, uint32) error {
	return func(ctx context.Context, sig uint32) error { return c.KillAll(ctx, id, execID, sig) }
}

// printSelfResult waits for a process started through the socket and
// prints its output; its exit status is the command's.
func printSelfResult(ctx context.Context, g globals, c *client.SelfClient, id, execID string, stdout, stderr io.Writer) (int, error) {
	res, err := c.Wait(ctx, id, execID)
	if err != nil {
		return 1, err
	}
	if g.json {
		return res.Code, PrintJSON(stdout, res)
	}
	_, _ = stdout.Write(res.Stdout)
	_, _ = stderr.Write(res.Stderr)
	if res.Truncated {
		fmt.Fprintln(stderr, "branchctl self exec: output truncated: the shim keeps the last 1 MiB per stream, less once the sandbox's processes not waited for hold 16 MiB")
	}
	if res.BranchEnded != "" {
		fmt.Fprintf(stderr, "branchctl self exec: killed with its branch: %s\n", res.BranchEnded)
	}
	return res.Code, nil
}

// printSelfTree prints the caller's branch and its live descendants as a
// tree, then the ended ones.
func printSelfTree(w io.Writer, self string, nodes []client.BranchInfo, now time.Time) error {
	kids := map[string][]client.BranchInfo{}
	var ended []client.BranchInfo
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BRANCH\tSTATE\tEPOCH\tSTATUS\tUPPER\tAGE")
	for _, n := range nodes {
		switch {
		case n.ID == self:
			fmt.Fprintf(tw, "%s (self)\t%s\t%d\t%s\t%s\t%s\n", n.ID, n.State, n.Epoch, n.Status, size(n.UpperSize), age(n, now))
		case n.State == branch.Live || n.State == branch.Committing:
			kids[n.Parent] = append(kids[n.Parent], n)
		default:
			ended = append(ended, n)
		}
	}
	var walk func(id, indent string)
	walk = func(id, indent string) {
		list := kids[id]
		sort.Slice(list, func(i, j int) bool { return numLess(list[i].ID, list[j].ID) })
		for _, n := range list {
			fmt.Fprintf(tw, "%s└─ %s\t%s\t%d\t%s\t%s\t%s\n", indent, n.ID, n.State, n.Epoch, n.Status, size(n.UpperSize), age(n, now))
			walk(n.ID, indent+"   ")
		}
	}
	walk(self, "")
	sort.Slice(ended, func(i, j int) bool { return numLess(ended[i].ID, ended[j].ID) })
	for _, n := range ended {
		what := string(n.State)
		if n.State == branch.Stale {
			what = fmt.Sprintf("stale (branch %s won)", n.Winner)
		}
		fmt.Fprintf(tw, "   %s (ended)\t%s\t%d\t\t\t%s\n", n.ID, what, n.Epoch, age(n, now))
	}
	return tw.Flush()
}
