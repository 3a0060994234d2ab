//go:build linux

package branchctl

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"github.com/branchbox/branchbox/client"
)

// cmdLs lists the sandboxes of the namespace: what a "not found" hint
// sends the user to.
func cmdLs(c *cli.Context, g globals, inv *invocation) error {
	ctx, stdout := c.Context, inv.stdout
	pos, _ := split(c)
	if len(pos) != 0 {
		return fmt.Errorf("ls takes no arguments, got %q: %w", pos, errdefs.ErrInvalidArgument)
	}
	list, err := client.ListSandboxes(ctx, g.address, g.namespace)
	if err != nil {
		return err
	}
	if g.json {
		if list == nil {
			list = []client.SandboxSummary{}
		}
		return PrintJSON(stdout, list)
	}
	return printSandboxes(stdout, list, time.Now())
}

func printSandboxes(w io.Writer, list []client.SandboxSummary, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tNAME\tSTATUS\tBRANCHES\tIMAGE\tAGE")
	for _, s := range list {
		id := s.ID
		if len(id) > 12 {
			id = id[:12]
		}
		status, branches := s.Status, fmt.Sprint(s.Branches)
		if status == "" {
			status = "no task"
		}
		if s.Status != "running" && s.Status != "paused" {
			branches = "-"
		}
		if s.Error != "" {
			// The row names the sandbox already.
			branches = "? (" + strings.TrimPrefix(s.Error, "sandbox "+s.ID+": ") + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", id, s.Name, status, branches, s.Image, now.Sub(s.Created).Round(time.Second))
	}
	return tw.Flush()
}
