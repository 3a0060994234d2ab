//go:build linux

package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
	"github.com/branchbox/branchbox/snapshotter"
)

// crashRounds is the number of rounds of each crash loop:
// $BRANCHBOX_CRASH_ROUNDS, or a few, to keep the test about a minute
// (`make crash-loop` runs 300).
func crashRounds(t *testing.T) int {
	if s := os.Getenv("BRANCHBOX_CRASH_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("BRANCHBOX_CRASH_ROUNDS=%q: want a positive number", s)
		}
		return n
	}
	return 4
}

// TestContextsCrashLoop kills (SIGKILL) the snapshotter, in a second
// variant the shim, and in a third either of them (picked at random each
// round, so that crashes of both come in every order), at a random
// moment of each round of a loop of
// checkpoint, fork (two branches, each with a setsid daemon that ignores
// SIGTERM and a marker file), commit of one, abort of the other and
// rollback to an earlier checkpoint, all through the shim. It restarts
// what it killed (a new task, for a killed shim takes its container down)
// and checks after every round: the sandbox's running processes see
// exactly the state before the interrupted operation or after it (told by
// the marker files); the shim runs exactly the branches the snapshotter
// holds live, and each of them can be aborted; once they are, no process
// of any branch is alive (from /proc and every cgroup hierarchy) and no
// branch cgroup, mount, layer directory, temporary mount or dead shim's
// socket is left; the snapshotter serves, and the sandbox is writable.
func TestContextsCrashLoop(t *testing.T) {
	rounds := crashRounds(t)
	for _, victim := range []string{"snapshotter", "shim", "either"} {
		t.Run(victim, func(t *testing.T) { crashLoop(t, victim, rounds) })
	}
}

// crashOp is one operation of a round, and the sandbox's state (its
// markers) once it is done.
type crashOp struct {
	name string
	do   func(ctx context.Context) error
}

func crashLoop(t *testing.T, victim string, rounds int) {
	ctx, env, cc := shimEnv(t)
	// The env's context ends after five minutes; a long loop runs for
	// longer (go test's -timeout bounds it).
	ctx = context.WithoutCancel(ctx)
	const id = "cl"
	img, err := cc.GetImage(ctx, ociimage.ImageRef)
	if err != nil {
		t.Fatal(err)
	}
	cont, err := cc.NewContainer(ctx, id,
		containerd.WithSnapshotter("branch"),
		containerd.WithNewSnapshot(id, img),
		containerd.WithRuntime(branchRuntime, nil),
		containerd.WithNewSpec(oci.WithImageConfig(img),
			oci.WithProcessArgs("sh", "-c", "mkdir -p /m && touch /m/base && exec sleep 100000")))
	if err != nil {
		t.Fatal(err)
	}
	var (
		task    containerd.Task
		sc      *client.SandboxClient
		shimPid int
		sockets []string
	)
	t.Cleanup(func() {
		if sc != nil {
			sc.Close()
		}
		// A round that failed with the snapshotter down: the containers'
		// removal (shimEnv's cleanup, after this one) needs it.
		if pid := env.SnapshotterPid(); pid == 0 || syscall.Kill(pid, 0) != nil {
			_ = env.StopSnapshotter(syscall.SIGKILL) // reaps a dead one
			if err := env.StartSnapshotter(ctx); err != nil {
				t.Errorf("restart the snapshotter: %v", err)
			}
		}
	})
	start := func() {
		t.Helper()
		before := map[int]bool{}
		for _, p := range env.ShimPids() {
			before[p] = true
		}
		// containerd forgets a dead shim's task a moment after its
		// cleanup ran: until then a new task "already exists".
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			task, err = cont.NewTask(ctx, cio.NullIO)
			if err == nil {
				break
			}
			if !errdefs.IsAlreadyExists(err) || time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
		if err := task.Start(ctx); err != nil {
			t.Fatal(err)
		}
		var (
			out  string
			xerr error
		)
		defer func() {
			if t.Failed() {
				st, err := task.Status(ctx)
				t.Logf("sandbox: ls /m: %q %v; task status %v %v", out, xerr, st, err)
			}
		}()
		waitUntil(t, "the sandbox to start", 10*time.Second, func() bool {
			out, xerr = execIn(ctx, env, id, "ls", "/m")
			return strings.Contains(out, "base")
		})
		shimPid = 0
		for _, p := range env.ShimPids() {
			if !before[p] {
				shimPid = p
			}
		}
		if shimPid == 0 {
			t.Fatal("no shim found for the sandbox")
		}
		sockets = existing(env.ShimSockets(shimPid))
		if sc != nil {
			sc.Close()
		}
		if sc, err = client.NewSandboxClient(ctx, env.Address, env.Namespace, id); err != nil {
			t.Fatal(err)
		}
	}
	start()

	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d, %d rounds", seed, rounds)
	state := []string{}              // the sandbox's markers
	ckpts := map[string][]string{}   // checkpoints made, and the markers they hold
	var ckptOrder []string           // oldest first
	var allProcs []hostProc          // every branch process seen
	stats := map[string]int{}        // the operation each kill interrupted
	window := 300 * time.Millisecond // the kill comes within this of a round's start
	for r := 0; r < rounds; r++ {
		var kids []client.BranchInfo
		winner := -1
		target := ""
		if len(ckptOrder) > 0 && rng.Intn(2) == 0 {
			target = ckptOrder[rng.Intn(len(ckptOrder))]
		}
		name := fmt.Sprintf("c%d", r)
		ops := []crashOp{
			{"checkpoint", func(ctx context.Context) error {
				if _, err := sc.Checkpoint(ctx, "", name); err != nil {
					return err
				}
				ckpts[name] = state
				ckptOrder = append(ckptOrder, name)
				return nil
			}},
			{"fork", func(ctx context.Context) (err error) {
				kids, err = sc.Fork(ctx, client.ForkOptions{Count: 2})
				return err
			}},
			{"daemons", func(ctx context.Context) error {
				for _, k := range kids {
					out, st, err := runErr(ctx, sc, k.ID, "sh", "-c", daemonScript(fmt.Sprintf("r%d-%s", r, k.ID)))
					if err != nil {
						return err
					}
					if st.Code != 0 {
						return fmt.Errorf("daemon in branch %s: exit %d: %s", k.ID, st.Code, out)
					}
					allProcs = append(allProcs, branchProcs(env, k)...)
				}
				winner = rng.Intn(len(kids))
				return nil
			}},
			{"commit", func(ctx context.Context) error {
				_, err := sc.Commit(ctx, kids[winner].ID)
				return err
			}},
			{"abort", func(ctx context.Context) error {
				// The loser is stale after the commit: that is the answer.
				_, err := sc.Abort(ctx, kids[1-winner].ID)
				if se := (*branch.StaleError)(nil); errors.As(err, &se) && se.Winner == kids[winner].ID {
					return nil
				}
				if err == nil {
					return errors.New("abort of the loser succeeded; want stale")
				}
				return err
			}},
			{"rollback", func(ctx context.Context) error {
				if target == "" {
					return nil
				}
				return sc.Rollback(ctx, "", target)
			}},
		}
		// What the sandbox holds after each operation, if it is made.
		after := func(op string) []string {
			switch {
			case op == "commit":
				return sorted(append(slices.Clone(state), fmt.Sprintf("r%d-%s", r, kids[winner].ID)))
			case op == "rollback" && target != "":
				return ckpts[target]
			}
			return state
		}

		// The kill, at a random moment of the round.
		killing := victim
		if victim == "either" {
			killing = []string{"snapshotter", "shim"}[rng.Intn(2)]
		}
		stats["killed "+killing]++
		// Half the snapshotter's deaths come from one of its fault points,
		// in the middle of an operation, where a random moment seldom
		// falls; the timer then kills it after the round if the point was
		// not reached.
		point := ""
		if killing == "snapshotter" && rng.Intn(2) == 0 {
			point = crashPoints[rng.Intn(len(crashPoints))]
			if err := env.StopSnapshotter(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := env.StartSnapshotter(ctx, "BRANCHBOX_FAULT_POINT="+point); err != nil {
				t.Fatal(err)
			}
		}
		var pid int
		if killing == "snapshotter" {
			pid = env.SnapshotterPid()
		} else {
			pid = shimPid
		}
		killed := make(chan struct{})
		var killOnce sync.Once
		// Within the time a whole round's operations take (as measured on
		// rounds the kill came after), so that most kills interrupt one.
		delay := time.Duration(rng.Int63n(int64(window)))
		if point != "" {
			delay = 2 * window
			go func() {
				for {
					select {
					case <-killed:
						return
					case <-time.After(time.Millisecond):
					}
					if syscall.Kill(pid, 0) == syscall.ESRCH {
						killOnce.Do(func() { stats["died at "+point]++; close(killed) })
						return
					}
				}
			}()
		}
		timer := time.AfterFunc(delay, func() {
			killOnce.Do(func() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				close(killed)
			})
		})
		allowed := [][]string{state}
		interrupted := "none (after the round)"
		began := time.Now()
		for _, op := range ops {
			octx, cancel := context.WithTimeout(ctx, 30*time.Second)
			before := state
			err := op.do(octx)
			cancel()
			if err == nil {
				state = after(op.name)
				allowed = [][]string{state}
				continue
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("round %d: %s hung for 30s: %v", r, op.name, err)
			}
			select {
			case <-killed:
			case <-time.After(time.Second):
				t.Fatalf("round %d: %s failed with no kill: %v", r, op.name, err)
			}
			interrupted = op.name
			allowed = [][]string{before, after(op.name)}
			// A checkpoint whose outcome is unknown is not rolled back to.
			break
		}
		if interrupted == "none (after the round)" {
			window = (window + time.Since(began)) / 2
		}
		<-killed
		timer.Stop()
		stats[interrupted]++

		// Restart what was killed.
		if killing == "snapshotter" {
			if err := env.StopSnapshotter(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if err := env.StartSnapshotter(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			waitUntil(t, "containerd to clean up after the dead shim", 20*time.Second, func() bool {
				if slices.Contains(env.ShimPids(), pid) {
					return false
				}
				st, err := task.Status(ctx)
				return errdefs.IsNotFound(err) || (err == nil && st.Status == containerd.Stopped)
			})
			waitUntil(t, "the dead shim's sockets to be removed", 10*time.Second, func() bool { return len(existing(sockets)) == 0 })
			// As a user would: delete the dead task, until containerd has
			// forgotten it.
			var delErr error
			waitUntil(t, "the dead shim's task to be deleted", 20*time.Second, func() bool {
				cur, err := cont.Task(ctx, nil)
				if errdefs.IsNotFound(err) {
					return true
				}
				if err == nil {
					_, delErr = cur.Delete(ctx)
				}
				return false
			})
			_ = delErr
			start()
		}
		if made := checkCrashRound(t, ctx, env, sc, id, r, interrupted, allowed, allProcs, &state); len(allowed) == 2 && interrupted != "checkpoint" && !slices.Equal(allowed[0], allowed[1]) {
			// Which way the interrupted change went.
			stats[interrupted+map[bool]string{true: " (made)", false: " (not made)"}[made]]++
		}
		// Keep a few checkpoints.
		for len(ckptOrder) > 3 {
			if err := sc.DeleteCheckpoint(ctx, ckptOrder[0]); err != nil {
				t.Fatalf("round %d: delete checkpoint %s: %v", r, ckptOrder[0], err)
			}
			delete(ckpts, ckptOrder[0])
			ckptOrder = ckptOrder[1:]
		}
		// A checkpoint killed midway may exist: drop it from the list of
		// known ones only; unknown ones are listed and removed.
		if list, err := sc.Checkpoints(ctx); err == nil {
			for _, ck := range list {
				if _, ok := ckpts[ck.Name]; !ok {
					_ = sc.DeleteCheckpoint(ctx, ck.Name)
				}
			}
		}
	}
	t.Logf("%s crash loop: %d rounds; kills by the operation they interrupted: %v", victim, rounds, stats)
}

// checkCrashRound checks the invariants after a round and its restart,
// and aborts the branches left live, so that the next round starts from
// the sandbox alone; state becomes the sandbox's markers. It says whether
// the sandbox holds the last of the allowed states.
func checkCrashRound(t *testing.T, ctx context.Context, env *daemons.Env, sc *client.SandboxClient, id string, r int, interrupted string, allowed [][]string, procs []hostProc, state *[]string) bool {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("round %d (kill during %s): %s", r, interrupted, fmt.Sprintf(format, args...))
	}
	got := rootMarkers(t, ctx, env, id)
	ok, made := false, false
	for i, a := range allowed {
		if slices.Equal(a, got) {
			ok, made = true, i == len(allowed)-1
		}
	}
	if !ok {
		fail("the sandbox sees markers %v; want one of %v", got, allowed)
	}
	*state = got
	// Shim and snapshotter agree, once the shim has reconciled (which a
	// call to it, or its own settle loop, does).
	var live, running []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		running = runningInShim(t, ctx, sc)
		live = liveInSnapshotter(t, ctx, env, id)
		if slices.Equal(live, running) {
			break
		}
		if time.Now().After(deadline) {
			fail("the snapshotter holds branches %v live, the shim runs %v", live, running)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, b := range live {
		if _, err := sc.Abort(ctx, b); err != nil {
			fail("abort of branch %s left live: %v", b, err)
		}
	}
	if l := liveInSnapshotter(t, ctx, env, id); len(l) != 0 {
		fail("branches live in the snapshotter after aborting all: %v", l)
	}
	var (
		left   []hostProc
		dirs   []string
		pids   []int
		mounts []string
		layers []string
	)
	bundle := filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, id, "branches")
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left = survivors(procs)
		dirs, pids = branchCgroupsOf(env.Namespace, id)
		mounts, _ = daemons.MountsUnder(bundle)
		layers, _ = filepath.Glob(filepath.Join(env.SnapshotterRoot, "branches", "*", "*"))
		if len(left)+len(dirs)+len(pids)+len(mounts)+len(layers) == 0 || time.Now().After(end) {
			break
		}
	}
	if len(left) != 0 {
		fail("processes of ended branches alive: %v", left)
	}
	if len(dirs) != 0 || len(pids) != 0 {
		fail("branch cgroups left: %v (processes %v)", dirs, pids)
	}
	if len(mounts) != 0 {
		fail("branch mounts left: %v", mounts)
	}
	if len(layers) != 0 {
		fail("branch layer directories left: %v", layers)
	}
	if tmp, _ := os.ReadDir(filepath.Join(env.SnapshotterRoot, "mnt")); len(tmp) != 0 {
		fail("temporary mounts left in the snapshotter's mnt: %d", len(tmp))
	}
	if m, _ := daemons.MountsUnder(filepath.Join(env.SnapshotterRoot, "mnt")); len(m) != 0 {
		fail("temporary mounts left: %v", m)
	}
	if _, err := execIn(ctx, env, id, "sh", "-c", "echo x > /probe && rm /probe"); err != nil {
		fail("the sandbox is not writable with no branch: %v", err)
	}
	return made
}

// crashPoints are the snapshotter's fault points a round's operations pass.
var crashPoints = []string{
	snapshotter.FaultForkDirs, snapshotter.FaultForkCommitted,
	snapshotter.FaultCommitDecided, snapshotter.FaultCommitApplied, snapshotter.FaultCommitFinished,
	snapshotter.FaultCheckpointWritten, snapshotter.FaultCheckpointInPlace, snapshotter.FaultCheckpointRecorded,
	snapshotter.FaultRollbackDecided, snapshotter.FaultRollbackApplied, snapshotter.FaultRollbackFinished,
}

func sorted(s []string) []string {
	sort.Strings(s)
	return s
}
