//go:build linux

package branchctl

import (
	"github.com/urfave/cli/v2"
)

// commands is branchctl's command table; each Action is a thin call into
// the command's function, which reads its flags from the cli.Context.
func commands(inv *invocation) []*cli.Command {
	do := func(f func(*cli.Context, globals, *invocation) error) cli.ActionFunc {
		return func(c *cli.Context) error {
			g := globalsOf(c)
			inv.namespace = g.namespace
			return f(c, g, inv)
		}
	}
	const (
		branches    = "branches"
		checkpoints = "checkpoints"
		images      = "images"
		explore     = "exploration patterns (exit 0 if something was committed, 1 if not, 2 for bad usage)"
	)
	cmds := []*cli.Command{
		{
			Name: "ls", Category: branches, Action: do(cmdLs), Flags: withGlobals(),
			Usage: "the sandboxes (containers on the branch runtime): id, name, status, live branches",
		},
		{
			Name: "fork", Category: branches, Action: do(cmdFork), Flags: withGlobals(forkFlags()...),
			ArgsUsage: "SANDBOX[/BRANCH] [-- CMD...]",
			Usage:     "make N branches of the sandbox or of a branch, each with a running init (or CMD as its init)",
		},
		{
			Name: "exec", Category: branches, Action: do(cmdExec),
			ArgsUsage: "SANDBOX/BRANCH -- CMD...",
			Usage:     "run CMD in a branch (stdio, exit status)",
			Flags: withGlobals(
				&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "allocate a terminal"},
				&cli.StringSliceFlag{Name: "env", Usage: "add an environment variable (K=V), repeatable"},
				&cli.StringFlag{Name: "cwd", Usage: "working directory"},
			),
		},
		{
			Name: "commit", Category: branches, Action: do(cmdCommit), Flags: withGlobals(),
			ArgsUsage: "SANDBOX/BRANCH",
			Usage:     "make a branch's changes its parent's; the first commit wins, siblings go",
		},
		{
			Name: "abort", Category: branches, Action: do(cmdAbort), Flags: withGlobals(),
			ArgsUsage: "SANDBOX/BRANCH",
			Usage:     "kill and discard a branch",
		},
		{
			Name: "logs", Category: branches, Action: do(cmdLogs), Flags: withGlobals(),
			ArgsUsage: "SANDBOX/BRANCH",
			Usage:     "what a branch's command (fork -- CMD), or a memory branch's processes, wrote: its last 1-2 MiB",
		},
		{
			Name: "tree", Category: branches, Action: do(cmdTree), Flags: withGlobals(),
			ArgsUsage: "SANDBOX",
			Usage:     "every branch: state, epoch, status, seal, processes, upper size, age",
		},
		{
			Name: "checkpoint", Category: checkpoints, Action: do(cmdCheckpoint),
			Flags:     withGlobals(&cli.BoolFlag{Name: "memory", Usage: "its running processes too (CRIU): fork --from NAME --memory restores them into each branch, rollback into the sandbox or a memory branch (docs/memory-fork.md)"}),
			ArgsUsage: "SANDBOX[/BRANCH] NAME | ls SANDBOX | rm SANDBOX NAME",
			Usage:     "record a branch's rootfs as NAME (cost: what changed since its last checkpoint); list; delete",
			Description: `checkpoint SANDBOX[/BRANCH] NAME records the branch's rootfs as NAME;
with --memory, its processes too.
checkpoint ls SANDBOX lists every checkpoint: branch, base, size, age.
checkpoint rm SANDBOX NAME deletes one (not while a branch is forked from
it); checkpoints built on it keep its layer while they need it.`,
		},
		{
			Name: "rollback", Category: checkpoints, Action: do(cmdRollback), Flags: withGlobals(),
			ArgsUsage: "SANDBOX[/BRANCH] NAME",
			Usage:     "bring the branch's rootfs back to checkpoint NAME, under its running processes; to one taken with --memory, its processes too",
		},
		{
			Name: "push", Category: images, Action: inv.heavy("push"), Flags: withGlobals(remoteFlags()...),
			ArgsUsage: "SANDBOX[/BRANCH|@CHECKPOINT] REF",
			Usage:     "push a branch as an OCI image: the sandbox image's layers, one per checkpoint on the path, one of the change since (docs/registry.md)",
		},
		{
			Name: "pull", Category: images, Action: inv.heavy("pull"), Flags: withGlobals(remoteFlags()...),
			ArgsUsage: "REF SANDBOX [-- CMD...]",
			Usage:     "make a sandbox (not started) of an image push made, with its checkpoints restored",
		},
		{
			Name: "save", Category: images, Action: inv.heavy("save"),
			ArgsUsage: "SANDBOX[/BRANCH] FILE",
			Usage:     "the image push would make, as an OCI layout tar",
			Flags:     withGlobals(&cli.StringFlag{Name: "name", Usage: "the image's name in the archive (default branchbox/SANDBOX:BRANCH)"}),
		},
		{
			Name: "load", Category: images, Action: inv.heavy("load"),
			ArgsUsage: "FILE [SANDBOX [-- CMD...]]",
			Usage:     "import such a tar, unpacked, to run; with SANDBOX, make a sandbox of it as pull does",
			Flags:     withGlobals(&cli.StringFlag{Name: "snapshotter", Value: "branch", Usage: "the snapshotter to unpack into"}),
		},
		selfCommand(inv),
		{
			Name: "speculate", Category: explore, Action: do(cmdSpeculate),
			ArgsUsage: "REF [-c SH]... [-n N -- CMD...]",
			Usage:     "run each -c (sh -c SH), and N copies of CMD, concurrently: the first to exit 0 wins",
			Flags: patternFlags(
				&cli.StringSliceFlag{Name: "c", Usage: "an attempt: a shell command (sh -c), repeatable"},
				&cli.IntFlag{Name: "n", Value: 1, Usage: "copies of the command after --"},
			),
		},
		{
			Name: "best-of-n", Category: explore, Action: do(cmdBestOfN),
			ArgsUsage: "REF -n N [--score SH | --score-file PATH] -- CMD...",
			Usage:     "run CMD N times, score each (last line of SH's stdout, of PATH, or of CMD's stdout), commit the highest (ties: lowest index)",
			Flags:     patternFlags(append(scoreFlags(), &cli.IntFlag{Name: "n", Usage: "number of branches"})...),
		},
		{
			Name: "tournament", Category: explore, Action: do(cmdTournament),
			ArgsUsage: "REF -n N --judge SH [--candidate-file PATH] -- CMD...",
			Usage:     "run CMD N times, judge pairs (SH prints a or b; candidates in files $BRANCHBOX_A and $BRANCHBOX_B), commit the last standing",
			Flags: patternFlags(
				&cli.IntFlag{Name: "n", Usage: "number of branches"},
				&cli.StringFlag{Name: "judge", Usage: "shell command judging two candidates ($BRANCHBOX_A, $BRANCHBOX_B): prints a or b"},
				&cli.StringFlag{Name: "candidate-file", Usage: "a branch's candidate is this file it wrote (default: its stdout)"},
			),
		},
		{
			Name: "reflexion", Category: explore, Action: do(cmdReflexion),
			ArgsUsage: "REF [--attempts K] -- CMD...",
			Usage:     "retry CMD in a fresh branch until it exits 0, with the last attempt's output in the file $BRANCHBOX_FEEDBACK",
			Flags:     patternFlags(&cli.IntFlag{Name: "attempts", Value: 3, Usage: "at most this many attempts"}),
		},
		{
			Name: "beam", Category: explore, Action: do(cmdSearch),
			ArgsUsage: "REF --width W --depth D --keep K [--goal G] [--score SH | --score-file PATH] -- STEP...",
			Usage:     "beam search: expand kept nodes into W children running STEP, keep the best K per depth, commit the best leaf's path",
			Flags:     patternFlags(append(searchFlags(), &cli.IntFlag{Name: "keep", Value: 2, Usage: "nodes kept per depth"})...),
		},
		{
			Name: "tree-search", Category: explore, Action: do(cmdSearch),
			ArgsUsage: "REF --width W --depth D [--budget B] [--goal G] [--score SH | --score-file PATH] -- STEP...",
			Usage:     "best-first search: expand the best node so far, B times; commit the best node's path",
			Flags:     patternFlags(append(searchFlags(), &cli.IntFlag{Name: "budget", Usage: "expansions, the start included (default: --depth)"})...),
		},
		serveCommand(inv),
		mcpCommand(inv),
		completionCommand(),
	}
	return cmds
}

// forkFlags are the options of a fork (fork, self fork).
func forkFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "n", Value: 1, Usage: "number of branches"},
		&cli.StringFlag{Name: "seal", Value: "ro", Usage: "how the parent is sealed while it has branches: ro (rootfs read-only) or freeze (processes frozen too)"},
		&cli.StringFlag{Name: "net", Value: "shared", Usage: "network: shared (the parent's namespace) or isolated (loopback only)"},
		&cli.BoolFlag{Name: "memory", Usage: "fork the parent's running processes too: each branch's continue from their state at the fork (CRIU; docs/memory-fork.md)"},
		&cli.StringFlag{Name: "memory-limit", Usage: "memory limit per branch (bytes, or with k, m, g); default the parent's"},
		&cli.Float64Flag{Name: "cpus", Usage: "CPU limit per branch; default the parent's"},
		&cli.Int64Flag{Name: "pids", Usage: "process limit per branch; default the parent's"},
		&cli.StringFlag{Name: "from", Usage: "fork from this checkpoint of the branch instead of its current state"},
	}
}

// remoteFlags are the registry options of push and pull.
func remoteFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "plain-http", Usage: "talk plain HTTP to a registry hosts.toml does not configure"},
		&cli.StringFlag{Name: "hosts-dir", Value: defaultHostsDir, Usage: "containerd's registry host configuration directory"},
		&cli.StringFlag{Name: "user", Usage: "USER[:SECRET] to authenticate to the registry"},
	}
}

// patternFlags are the options every pattern takes, and its own.
func patternFlags(own ...cli.Flag) []cli.Flag {
	return withGlobals(append([]cli.Flag{
		&cli.DurationFlag{Name: "timeout", Usage: "overall timeout (e.g. 30s): then every branch still running is aborted; 0: none"},
		&cli.DurationFlag{Name: "branch-timeout", Usage: "timeout of each branch's work, from its fork; a branch over it is aborted and reported as timeout; 0: none"},
		&cli.StringSliceFlag{Name: "env", Usage: "add an environment variable (K=V) to every command, repeatable (commands also see BRANCH_INDEX, and BRANCHBOX_DEPTH in searches)"},
		&cli.StringFlag{Name: "seal", Value: "ro", Usage: "how the parent is sealed while it has branches: ro or freeze"},
		&cli.StringFlag{Name: "net", Value: "shared", Usage: "branch network: shared or isolated"},
		&cli.StringFlag{Name: "memory-limit", Usage: "memory limit per branch (bytes, or with k, m, g)"},
		&cli.Float64Flag{Name: "cpus", Usage: "CPU limit per branch"},
		&cli.Int64Flag{Name: "pids", Usage: "process limit per branch"},
	}, own...)...)
}

func scoreFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "score", Usage: "score each branch by this shell command run in it (last line of its stdout)"},
		&cli.StringFlag{Name: "score-file", Usage: "score each branch by the last line of this file it wrote"},
	}
}

func searchFlags() []cli.Flag {
	return append(scoreFlags(),
		&cli.IntFlag{Name: "width", Value: 2, Usage: "children per expanded node"},
		&cli.IntFlag{Name: "depth", Value: 2, Usage: "deepest level"},
		&cli.StringFlag{Name: "goal", Usage: "stop once a node scores at least this"},
	)
}
