//go:build linux

package integration

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"testing"

	"github.com/branchbox/branchbox/client"
)

// BenchmarkSDKRound: one fork+exec+commit round (fork 1 branch of a
// running 10,000-file sandbox, run true in it, commit it) through each SDK
// over `branchctl serve`'s unix socket (impl=branch), beside the same round
// through the Go client (impl=go-client) in the same run; the ratio is the
// cost of the HTTP API and the SDK. The SDK's process stays up and is
// told to run each round over a pipe, as an agent's would.
func BenchmarkSDKRound(b *testing.B) {
	ctx, env, _, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	srv := startServe(b, env, false)
	for _, sdk := range []struct {
		name string
		cmd  []string
		dir  string
	}{
		{"python", []string{"/usr/bin/python3", "bench/round.py"}, "../sdk/python"},
		{"typescript", []string{"node", "bench/round.mjs"}, "../sdk/typescript"},
	} {
		id := "bench-" + sdk.name
		sc, _ := benchSandbox(b, ctx, env, id)
		b.Run("sdk="+sdk.name+"/impl=go-client", func(b *testing.B) {
			for b.Loop() {
				goRound(b, ctx, sc)
			}
		})
		b.Run("sdk="+sdk.name+"/impl=branch", func(b *testing.B) {
			cmd := exec.Command(sdk.cmd[0], sdk.cmd[1:]...)
			cmd.Dir = sdk.dir
			cmd.Env = append(os.Environ(), "BRANCHBOX_SOCKET="+srv.Socket, "BRANCHBOX_NAMESPACE="+env.Namespace, "BRANCHBOX_SANDBOX="+id)
			cmd.Stderr = os.Stderr
			in, err := cmd.StdinPipe()
			if err != nil {
				b.Fatal(err)
			}
			outPipe, err := cmd.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			defer func() {
				in.Close()
				_ = cmd.Wait()
			}()
			out := bufio.NewReader(outPipe)
			round := func() {
				if _, err := io.WriteString(in, "round\n"); err != nil {
					b.Fatal(err)
				}
				if l, err := out.ReadString('\n'); err != nil || l != "ok\n" {
					b.Fatalf("%s round: %q %v", sdk.name, l, err)
				}
			}
			round() // the interpreter's start and the first connection are not a round's
			b.ResetTimer()
			for b.Loop() {
				round()
			}
		})
	}
}

func goRound(b *testing.B, ctx context.Context, sc *client.SandboxClient) {
	kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
	if err != nil {
		b.Fatal(err)
	}
	st, err := sc.Run(ctx, kids[0].ID, client.ExecOptions{Args: []string{"true"}})
	if err != nil || st.Code != 0 {
		b.Fatalf("exec: %v %v", st, err)
	}
	if _, err := sc.Commit(ctx, kids[0].ID); err != nil {
		b.Fatal(err)
	}
}
