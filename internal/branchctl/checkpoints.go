package branchctl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// cmdCheckpoint: checkpoint SANDBOX[/BRANCH] NAME | checkpoint ls SANDBOX |
// checkpoint rm SANDBOX NAME.
func cmdCheckpoint(cc *cli.Context, g globals, inv *invocation) error {
	ctx, stdout := cc.Context, inv.stdout
	pos, _ := split(cc)
	if len(pos) == 0 {
		return fmt.Errorf("want SANDBOX[/BRANCH] NAME, ls SANDBOX or rm SANDBOX NAME: %w", errdefs.ErrInvalidArgument)
	}
	switch pos[0] {
	case "ls", "list":
		if len(pos) != 2 {
			return fmt.Errorf("want checkpoint ls SANDBOX: %w", errdefs.ErrInvalidArgument)
		}
		return checkpointList(ctx, g, pos[1], stdout)
	case "rm", "delete":
		if len(pos) != 3 {
			return fmt.Errorf("want checkpoint rm SANDBOX NAME: %w", errdefs.ErrInvalidArgument)
		}
		c, err := dial(ctx, g, pos[1])
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.DeleteCheckpoint(ctx, pos[2]); err != nil {
			return err
		}
		if g.json {
			return PrintJSON(stdout, map[string]string{"deleted": pos[2]})
		}
		fmt.Fprintf(stdout, "deleted checkpoint %s\n", pos[2])
		return nil
	}
	if len(pos) != 2 {
		return fmt.Errorf("want checkpoint SANDBOX[/BRANCH] NAME, got %v: %w", pos, errdefs.ErrInvalidArgument)
	}
	sb, b, err := splitRef(pos[0], false)
	if err != nil {
		return err
	}
	c, err := dial(ctx, g, sb)
	if err != nil {
		return err
	}
	defer c.Close()
	start := time.Now()
	var opts []client.CheckpointOption
	if cc.Bool("memory") {
		opts = append(opts, client.CheckpointWithMemory())
	}
	ck, err := c.Checkpoint(ctx, b, pos[1], opts...)
	if err != nil {
		return err
	}
	if g.json {
		return PrintJSON(stdout, ck)
	}
	base := "full"
	if ck.Parent != "" {
		base = "changes since " + ck.Parent
	}
	mem := ""
	if ck.MemoryBytes > 0 {
		mem = fmt.Sprintf(", processes %s", size(ck.MemoryBytes))
	}
	fmt.Fprintf(stdout, "checkpoint %s of %s: %s, %s in %d entries%s, in %s\n", ck.Name, refName(sb, ck.Branch), base, size(ck.Size), ck.Entries, mem, time.Since(start).Round(time.Microsecond))
	return nil
}

func refName(sb, id string) string {
	if id == "" || id == branch.RootID {
		return sb
	}
	return sb + "/" + id
}

func checkpointList(ctx context.Context, g globals, sb string, stdout io.Writer) error {
	c, err := dial(ctx, g, sb)
	if err != nil {
		return err
	}
	defer c.Close()
	list, err := c.Checkpoints(ctx)
	if err != nil {
		return err
	}
	if g.json {
		if list == nil {
			list = []branch.Checkpoint{}
		}
		return PrintJSON(stdout, list)
	}
	return PrintCheckpoints(stdout, sb, list, time.Now())
}

// PrintCheckpoints prints checkpoints as a table, oldest first.
func PrintCheckpoints(w io.Writer, sb string, list []branch.Checkpoint, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tBRANCH\tBASE\tSIZE\tENTRIES\tPROCESSES\tAGE\tBUILT ON IT")
	for _, ck := range list {
		base := ck.Parent
		if base == "" {
			base = "(full)"
		}
		name := ck.Name
		if ck.Head {
			name += " *"
		}
		var on []string
		on = append(on, ck.Children...)
		for _, b := range ck.Branches {
			on = append(on, "branch "+b)
		}
		procs := "-"
		if ck.MemoryBytes > 0 {
			procs = size(ck.MemoryBytes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", name, refName(sb, ck.Branch), base, size(ck.Size), ck.Entries, procs, ck.Age(now).Round(time.Millisecond), strings.Join(on, ", "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(list) > 0 {
		fmt.Fprintln(w, "* the branch's head: its next checkpoint holds the changes since this one. BASE: the checkpoint this one holds the changes since ((full): all of it). PROCESSES: its memory image, if taken with --memory.")
	}
	return nil
}

func cmdRollback(cc *cli.Context, g globals, inv *invocation) error {
	ctx, stdout := cc.Context, inv.stdout
	pos, _ := split(cc)
	if len(pos) != 2 {
		return fmt.Errorf("want rollback SANDBOX[/BRANCH] NAME, got %v: %w", pos, errdefs.ErrInvalidArgument)
	}
	sb, b, err := splitRef(pos[0], false)
	if err != nil {
		return err
	}
	c, err := dial(ctx, g, sb)
	if err != nil {
		return err
	}
	defer c.Close()
	start := time.Now()
	if err := c.Rollback(ctx, b, pos[1]); err != nil {
		return err
	}
	took := time.Since(start)
	if g.json {
		// "context": the key's old name (deprecated: docs/design.md#names).
		ref := refName(sb, b)
		return PrintJSON(stdout, map[string]any{"branch": ref, "context": ref, "checkpoint": pos[1], "seconds": took.Seconds()})
	}
	fmt.Fprintf(stdout, "rolled %s back to %s in %s\n", refName(sb, b), pos[1], took.Round(time.Microsecond))
	return nil
}
