//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch/oci"
)

// cmdPush: push SANDBOX[/BRANCH] REF [--plain-http] [--hosts-dir DIR]
// [--user USER[:SECRET]].
func cmdPush(ctx context.Context, g globals, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	fs.StringVar(&g.address, "address", g.address, "containerd's socket")
	fs.StringVar(&g.namespace, "namespace", g.namespace, "containerd namespace")
	fs.BoolVar(&g.json, "json", g.json, "print JSON")
	var remote oci.Remote
	var user string
	fs.BoolVar(&remote.PlainHTTP, "plain-http", false, "talk plain HTTP to a registry hosts.toml does not configure")
	fs.StringVar(&remote.HostsDir, "hosts-dir", oci.DefaultHostsDir, "containerd's registry host configuration directory")
	fs.StringVar(&user, "user", "", "USER[:SECRET] to authenticate to the registry")
	pos, _, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("want push SANDBOX[/BRANCH] REF, got %q: %w", pos, errdefs.ErrInvalidArgument)
	}
	src, err := oci.ParseSource(pos[0])
	if err != nil {
		return err
	}
	remote.User, remote.Secret, _ = strings.Cut(user, ":")
	client, err := containerd.New(g.address)
	if err != nil {
		return fmt.Errorf("connect to containerd at %s: %w", g.address, err)
	}
	defer client.Close()
	res, err := oci.Push(namespaces.WithNamespace(ctx, g.namespace), client, src, pos[1], remote)
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(stdout, map[string]any{
			"ref": res.Ref, "manifest": res.Image.Manifest.Digest, "layers": res.Image.Layers,
			"change": res.Image.Change, "sentBlobs": len(res.Sent.Blobs), "sentBytes": res.Sent.Bytes,
			"skippedBlobs": res.Sent.Skipped,
		})
	}
	fmt.Fprintf(stdout, "pushed %s as %s (%s): change layer %s, %d bytes in %d blobs sent, %d already there\n",
		src, res.Ref, res.Image.Manifest.Digest, res.Image.Change.Digest, res.Sent.Bytes, len(res.Sent.Blobs), res.Sent.Skipped)
	return nil
}
