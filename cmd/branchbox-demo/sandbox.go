//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// The project: calc.sh should add, but subtracts; test.sh checks it.
const project = `mkdir -p /project && cd /project &&
printf '#!/bin/sh\necho $(( $1 - $2 ))\n' > calc.sh &&
printf '#!/bin/sh\nok=1\n[ "$(sh /project/calc.sh 2 3)" = 5 ] || ok=0\n[ "$(sh /project/calc.sh 10 -4)" = 6 ] || ok=0\n[ $ok = 1 ] && echo PASS || { echo FAIL; exit 1; }\n' > test.sh &&
exec sleep 100000`

// fixes are what four explorers try; the slow one passes too, but second.
var fixes = []struct{ name, script string }{
	{"swap the operands", `sed -i 's/\$1 - \$2/$2 - $1/' /project/calc.sh`},
	{"multiply instead", `sed -i 's/\$1 - \$2/$1 * $2/' /project/calc.sh`},
	{"add (thorough: lint first)", `sleep 0.3; sed -i 's/\$1 - \$2/$1 + $2/' /project/calc.sh`},
	{"add", `sed -i 's/\$1 - \$2/$1 + $2/' /project/calc.sh`},
}

type timer func(name string, fn func() error) error

func runSandbox(ctx context.Context, env *daemons.Env, timed timer) error {
	const id = "agent"
	if err := timed("ctr run --runtime io.containerd.branch.v1 (the sandbox)", func() error {
		_, err := env.Ctr(ctx, "run", "-d", "--runtime", branch.RuntimeName, "--snapshotter", "branch", ociimage.ImageRef, id, "sh", "-c", project)
		return err
	}); err != nil {
		return err
	}
	defer func() {
		_, _ = env.Ctr(context.WithoutCancel(ctx), "tasks", "kill", "-s", "SIGKILL", id)
		for i := 0; i < 100; i++ {
			if _, err := env.Ctr(context.WithoutCancel(ctx), "tasks", "delete", id); err == nil || strings.Contains(err.Error(), "not found") {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		_, _ = env.Ctr(context.WithoutCancel(ctx), "containers", "delete", id)
	}()
	test := func() string {
		out, _ := env.Ctr(ctx, "tasks", "exec", "--exec-id", fmt.Sprintf("t%d", time.Now().UnixNano()), id, "sh", "/project/test.sh")
		return strings.TrimSpace(out)
	}
	for deadline := time.Now().Add(10 * time.Second); test() == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("the sandbox did not set up its project")
		}
	}
	fmt.Printf("  the sandbox's test: %s\n", test())

	sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, id)
	if err != nil {
		return err
	}
	defer sc.Close()
	var kids []client.BranchInfo
	if err := timed(fmt.Sprintf("fork %d branches (each with a running init)", len(fixes)), func() (err error) {
		kids, err = sc.Fork(ctx, client.ForkOptions{Count: len(fixes)})
		return err
	}); err != nil {
		return err
	}
	type result struct {
		branch, fix, output, commit string
		took                        time.Duration
	}
	results := make([]result, len(kids))
	var mu sync.Mutex
	winner := ""
	var wg sync.WaitGroup
	start := time.Now()
	for i, k := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := result{branch: k.ID, fix: fixes[i].name}
			defer func() { r.took = time.Since(start); results[i] = r }()
			var out client.Output
			st, err := sc.Run(ctx, k.ID, client.ExecOptions{
				Args: []string{"sh", "-c", fixes[i].script + " && sh /project/test.sh"}, Stdout: &out, Stderr: &out,
			})
			r.output = strings.TrimSpace(out.String())
			var se *branch.StaleError
			switch {
			case errors.As(err, &se):
				r.output, r.commit = "-", fmt.Sprintf("invalidated: branch %s committed first", se.Winner)
				return
			case err != nil:
				r.output, r.commit = "-", err.Error()
				return
			case st.Code == 137:
				r.output, r.commit = "-", "killed: a sibling committed first"
				return
			case st.Code != 0:
				r.commit = "test failed; branch left to be invalidated"
				return
			}
			// It passed: try to commit. The first commit wins.
			t0 := time.Now()
			if _, err := sc.Commit(ctx, k.ID); err != nil {
				r.commit = "lost: " + err.Error()
				return
			}
			r.commit = fmt.Sprintf("committed in %s", time.Since(t0).Round(100*time.Microsecond))
			mu.Lock()
			winner = k.ID
			mu.Unlock()
		}()
	}
	wg.Wait()
	fmt.Printf("  %-8s %-28s %-6s %9s  %s\n", "branch", "fix", "test", "after", "outcome")
	for _, r := range results {
		outcome := r.commit
		fmt.Printf("  %-8s %-28s %-6s %9s  %s\n", r.branch, r.fix, r.output, r.took.Round(100*time.Microsecond), outcome)
	}
	if winner == "" {
		return errors.New("no branch passed the test")
	}
	fmt.Printf("  the sandbox's test now (its running processes see the fix): %s\n", test())
	cmd := exec.CommandContext(ctx, filepath.Join(env.BinDir, "branchctl"), "--address", env.Address, "--namespace", env.Namespace, "tree", id)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("branchctl tree: %v: %s", err, out)
	}
	fmt.Printf("  branchctl tree %s:\n%s", id, indent(string(out)))
	if got := test(); got != "PASS" {
		return fmt.Errorf("sandbox test after commit: %q", got)
	}
	return nil
}
