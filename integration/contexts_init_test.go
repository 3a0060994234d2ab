//go:build linux

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// confinement is what a process reports of its confinement: capability
// sets, no_new_privs, seccomp mode, open-file limit and host name.
const confinement = `grep -E '^(NoNewPrivs|Seccomp|CapInh|CapPrm|CapEff|CapBnd|CapAmb):' /proc/self/status | tr -d '\t '; ulimit -n; hostname`

// TestContextsBranchInit checks a branch started by the branch init
// (containerd-shim-branch-v1-init) against the sandbox it came from and
// against what runc would have built: the same confinement as a process
// exec'd into the sandbox, its own PID namespace with the init as PID 1,
// its own /dev/pts, /dev/shm and cgroup, the spec's masked and read-only
// paths, and a bind mount of the spec.
func TestContextsBranchInit(t *testing.T) { testBranchInit(t) }

// TestContextsBranchInitSeccomp is TestContextsBranchInit on a sandbox
// with containerd's default seccomp profile: the init applies the filter
// and everything else the same.
func TestContextsBranchInitSeccomp(t *testing.T) { testBranchInit(t, "--seccomp") }

func testBranchInit(t *testing.T, extra ...string) {
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "f"), []byte("bound\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, env, sc := sandboxCtxEnv(t, append([]string{"--cap-drop", "CAP_NET_RAW", "--hostname", "hb",
		"--mount", "type=bind,src=" + host + ",dst=/mnt,options=rbind:ro"}, extra...)...)
	want, err := execIn(ctx, env, "sb", "sh", "-c", confinement)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(want, "\n1024\nhb\n") || strings.Contains(want, "CapBnd:000001ffffffffff") {
		t.Fatalf("the sandbox's confinement is not what it was run with:\n%s", want)
	}
	// The first fork's branches have inits started for them; once they
	// are gone, the next fork's take inits started ahead, which made the
	// early part of their roots before it: both are checked, and their
	// mounts (all but the rootfs, without ids and device numbers) must be
	// the same.
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 2})
	const mounts = `awk '$5 != "/" {$1=$2=$3=""; print}' /proc/self/mountinfo`
	first := mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", mounts)
	for _, k := range kids {
		if _, err := sc.Abort(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
	}
	kids = fork(t, ctx, sc, client.ForkOptions{Count: 2})
	if got := mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", mounts); got != first {
		t.Errorf("mounts of a branch whose init was started ahead:\n%s\nwant as a first fork's:\n%s", got, first)
	}
	a, b := kids[0], kids[1]
	if got := mustRun(t, ctx, sc, a.ID, "sh", "-c", confinement); got != want {
		t.Errorf("a branch's process:\n%s\nwant as in the sandbox:\n%s", got, want)
	}
	// PID 1 is the init; the branch sees its own processes only.
	// (The shell counts by a glob: a pipeline's second command may not
	// be started yet when the first lists /proc.)
	if got := mustRun(t, ctx, sc, a.ID, "sh", "-c", "cat /proc/1/comm; set -- /proc/[0-9]*; echo $#"); got != "brinit\n2\n" {
		t.Errorf("branch's /proc/1/comm and process count: %q; want brinit, 2 (the init, sh)", got)
	}
	// Its own terminal devices and shared memory: what one branch makes
	// there, a sibling does not see.
	mustRun(t, ctx, sc, a.ID, "sh", "-c", "echo x > /dev/shm/a-only")
	if out, code := run(t, ctx, sc, b.ID, "ls", "/dev/shm/a-only"); code == 0 {
		t.Errorf("a sibling sees /dev/shm/a-only: %q", out)
	}
	if got := mustRun(t, ctx, sc, a.ID, "ls", "/dev/pts"); strings.TrimSpace(got) != "ptmx" {
		t.Errorf("a branch's /dev/pts: %q; want a new instance (ptmx only)", got)
	}
	// The spec's masks, read-only paths and bind mount.
	for _, c := range []struct{ cmd, want string }{
		{"wc -c < /proc/keys", "0\n"},
		{"(echo 1 > /proc/sys/kernel/domainname) 2>/dev/null && echo writable || echo ro", "ro\n"},
		{"cat /mnt/f; touch /mnt/g 2>/dev/null && echo writable || echo ro", "bound\nro\n"},
		{"cat /proc/self/cgroup | grep -c '/b" + a.ID + "$'", ""},
		{"test -c /dev/null && test -L /dev/ptmx && test -L /dev/fd && echo devices", "devices\n"},
		// The spec's modes, whatever the init's umask (as runc makes them).
		{"stat -c %a /dev/null /dev/zero /dev/tty", "666\n666\n666\n"},
	} {
		got := mustRun(t, ctx, sc, a.ID, "sh", "-c", c.cmd)
		if c.want == "" {
			if got == "0\n" {
				t.Errorf("%s: %q; want the branch's own cgroup", c.cmd, got)
			}
			continue
		}
		if got != c.want {
			t.Errorf("%s: %q, want %q", c.cmd, got, c.want)
		}
	}
	// An exec that cannot start says why.
	if _, _, err := runErr(ctx, sc, a.ID, "/no/such/binary"); err == nil || !strings.Contains(err.Error(), "/no/such/binary") {
		t.Errorf("exec of a missing binary: %v; want an error naming it", err)
	}
	if _, err := sc.Commit(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	assertBranchGone(t, env, a, nil)
	assertBranchGone(t, env, b, nil)
}

// TestContextsRuntimeFallback: a sandbox whose spec the branch init does
// not take (here CAP_SYS_PTRACE in its bounding set) has its branches run
// by the runtime, which carries its seccomp filter over, and the cycle
// works the same.
func TestContextsRuntimeFallback(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t, "--seccomp", "--cap-add", "CAP_SYS_PTRACE")
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 2})
	for _, k := range kids {
		assertDomainCgroup(t, "branch "+k.ID+" started by the runtime", k.Cgroup)
	}
	if got := mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", "grep '^Seccomp:' /proc/self/status | tr -d '\t '; cat /proc/1/comm"); strings.HasPrefix(got, "Seccomp:2\nbrinit") || !strings.HasPrefix(got, "Seccomp:2\n") {
		t.Fatalf("a branch of a seccomp sandbox: %q; want the filter on, from the runtime", got)
	}
	mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", "echo fallback > /state")
	if _, err := sc.Commit(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/state"); err != nil || out != "fallback\n" {
		t.Fatalf("sandbox after commit: %q %v", out, err)
	}
	assertBranchGone(t, env, kids[0], nil)
	assertBranchGone(t, env, kids[1], nil)
	if !strings.Contains(env.Log("containerd"), "reason=CAP_SYS_PTRACE") {
		t.Errorf("the shim did not log why the sandbox's branches are started by the runtime")
	}
}

// TestContextsWarmInits forks and aborts back to back, so that forks take
// inits started ahead (some still being moved into their cgroups, renamed
// to the names the next branch ids give while the snapshotter makes the
// branches): every branch runs in the cgroup it reports, under its own
// name, and nothing of the pool is left once the sandbox is gone. Every
// fourth round a fork and abort made in the snapshotter behind the shim's
// back uses up the id the shim expects next, so that its guessed names
// are wrong.
func TestContextsWarmInits(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	bc, root := snapshotterRoot(t, env, "sb")
	defer bc.Close()
	for i := 0; i < 12; i++ {
		if i%4 == 3 {
			behind, err := bc.Fork(ctx, branch.Ref{Root: root}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := bc.Abort(ctx, branch.Ref{Root: root, Branch: behind[0].ID}); err != nil {
				t.Fatal(err)
			}
		}
		opts := client.ForkOptions{Count: 1 + i%3}
		if i%5 == 4 {
			// Not the pool's flags: the init the pool started in the
			// cgroup of the next id is discarded, not joined.
			opts.Net = "isolated"
		}
		kids := fork(t, ctx, sc, opts)
		for _, k := range kids {
			if !strings.HasSuffix(k.Cgroup, "/b"+k.ID) {
				t.Fatalf("round %d: branch %s has cgroup %s, want one named b%s", i, k.ID, k.Cgroup, k.ID)
			}
			got := mustRun(t, ctx, sc, k.ID, "sh", "-c", "grep -c ':"+k.Cgroup+"$' /proc/self/cgroup")
			if got == "0\n" {
				t.Fatalf("round %d: branch %s's process is not in %s", i, k.ID, k.Cgroup)
			}
			// Every hierarchy's cgroup is the branch's, none a pool's.
			if got := mustRun(t, ctx, sc, k.ID, "sh", "-c", "grep -c 'bbx-pool-' /proc/self/cgroup; true"); got != "0\n" {
				t.Fatalf("round %d: branch %s's process is in a pool's cgroup: %s", i, k.ID, mustRun(t, ctx, sc, k.ID, "cat", "/proc/self/cgroup"))
			}
			// One process: the init and the one exec'd (the pool's init
			// of the next name is another cgroup's, not this one's).
			if n := len(cgroupProcs(t, k.Cgroup)); n > 1 {
				t.Fatalf("round %d: branch %s's cgroup %s holds %d processes, want its init only", i, k.ID, k.Cgroup, n)
			}
			assertDomainCgroup(t, fmt.Sprintf("round %d: branch %s", i, k.ID), k.Cgroup)
		}
		for _, k := range kids {
			if _, err := sc.Abort(ctx, k.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Inits started ahead made the early part of their roots (their
	// filesystems, /dev's nodes) before the forks.
	if n := strings.Count(env.Log("containerd"), "made the early part of its root"); n == 0 {
		t.Fatal("no branch was started by an init that made the early part of its root ahead")
	}
	removeContainer(t, env, "sb")
	pool, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", env.Namespace, "sb", "bbx-pool-*"))
	v2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", env.Namespace, "sb", "bbx-pool-*"))
	pool = append(pool, v2...)
	if len(pool) != 0 {
		t.Fatalf("pool cgroups left after the sandbox: %v", pool)
	}
}
