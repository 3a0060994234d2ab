//go:build linux

package main

import (
	"fmt"
	"os"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/client/oci"
	"github.com/branchbox/branchbox/internal/branchctl"
)

// cmdPush: push SANDBOX[/BRANCH] REF [--plain-http] [--hosts-dir DIR]
// [--user USER[:SECRET]].
func cmdPush(c *cli.Context, e branchctl.Env) error {
	ctx, stdout := c.Context, e.Stdout
	remote := remoteOf(c)
	pos, _ := branchctl.Args(c)
	if len(pos) != 2 {
		return fmt.Errorf("want push SANDBOX[/BRANCH] REF, got %q: %w", pos, errdefs.ErrInvalidArgument)
	}
	src, err := oci.ParseSource(pos[0])
	if err != nil {
		return err
	}
	// The image is of the container the user named (id, prefix or name).
	if src.Sandbox, err = client.ResolveSandbox(ctx, e.Address, e.Namespace, src.Sandbox); err != nil {
		return err
	}
	cc, err := dialContainerd(e.Address)
	if err != nil {
		return err
	}
	defer cc.Close()
	res, err := oci.Push(namespaces.WithNamespace(ctx, e.Namespace), cc, src, pos[1], remote)
	if err != nil {
		return err
	}
	if e.JSON {
		return branchctl.PrintJSON(stdout, map[string]any{
			"ref": res.Ref, "root": res.Image.Root.Digest, "manifest": res.Image.Manifest.Digest, "layers": res.Image.Layers,
			"change": res.Image.Change, "checkpoints": res.Image.Lineage.Checkpoints, "sentBlobs": len(res.Sent.Blobs), "sentBytes": res.Sent.Bytes,
			"skippedBlobs": res.Sent.Skipped,
		})
	}
	mem := ""
	if res.Image.Root.Digest != res.Image.Manifest.Digest {
		n := 0
		for _, ck := range res.Image.Lineage.Checkpoints {
			if ck.Memory != "" {
				n++
			}
		}
		mem = fmt.Sprintf(", in index %s with the memory images of %d checkpoints", res.Image.Root.Digest, n)
	}
	fmt.Fprintf(stdout, "pushed %s as %s (%s%s): change layer %s, %d bytes in %d blobs sent, %d already there\n",
		src, res.Ref, res.Image.Manifest.Digest, mem, res.Image.Change.Digest, res.Sent.Bytes, len(res.Sent.Blobs), res.Sent.Skipped)
	return nil
}

// cmdSave: save SANDBOX[/BRANCH] FILE [--name NAME].
func cmdSave(c *cli.Context, e branchctl.Env) error {
	ctx, stdout := c.Context, e.Stdout
	name := c.String("name")
	pos, _ := branchctl.Args(c)
	if len(pos) != 2 {
		return fmt.Errorf("want save SANDBOX[/BRANCH] FILE, got %q: %w", pos, errdefs.ErrInvalidArgument)
	}
	src, err := oci.ParseSource(pos[0])
	if err != nil {
		return err
	}
	// The image is of the container the user named (id, prefix or name).
	named := src.Sandbox
	if src.Sandbox, err = client.ResolveSandbox(ctx, e.Address, e.Namespace, src.Sandbox); err != nil {
		return err
	}
	if name == "" {
		branchID := src.Branch
		if branchID == "" {
			branchID = "0"
		}
		name = "branchbox/" + strings.ToLower(named) + ":" + branchID
	}
	cc, err := dialContainerd(e.Address)
	if err != nil {
		return err
	}
	defer cc.Close()
	img, err := oci.Save(namespaces.WithNamespace(ctx, e.Namespace), cc, src, name, pos[1])
	if err != nil {
		return err
	}
	if e.JSON {
		return branchctl.PrintJSON(stdout, map[string]any{"file": pos[1], "name": name, "manifest": img.Manifest.Digest, "change": img.Change})
	}
	fmt.Fprintf(stdout, "saved %s as %s (%s) in %s\n", src, name, img.Manifest.Digest, pos[1])
	return nil
}

// cmdLoad: load FILE [--snapshotter NAME], or load FILE SANDBOX [-- CMD...]
// (a sandbox made of the archive's image, its checkpoints restored, as
// pull makes one).
func cmdLoad(c *cli.Context, e branchctl.Env) error {
	ctx, stdout := c.Context, e.Stdout
	sn := c.String("snapshotter")
	pos, cmd := branchctl.Args(c)
	if len(pos) < 1 || len(pos) > 2 || (len(pos) == 1 && len(cmd) > 0) {
		return fmt.Errorf("want load FILE, or load FILE SANDBOX [-- CMD...], got %q: %w", pos, errdefs.ErrInvalidArgument)
	}
	if len(pos) == 2 && sn != "branch" {
		return fmt.Errorf("load FILE SANDBOX makes a sandbox on snapshotter branch, not %s: %w", sn, errdefs.ErrInvalidArgument)
	}
	f, err := os.Open(pos[0])
	if err != nil {
		return err
	}
	defer f.Close()
	cc, err := dialContainerd(e.Address)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx = namespaces.WithNamespace(ctx, e.Namespace)
	if len(pos) == 2 {
		res, err := oci.LoadSandbox(ctx, cc, f, pos[1], cmd...)
		if err != nil {
			return err
		}
		if e.JSON {
			return branchctl.PrintJSON(stdout, map[string]any{"images": []string{res.Ref}, "sandbox": res.Sandbox, "checkpoints": res.Checkpoints})
		}
		fmt.Fprintf(stdout, "made sandbox %s of %s with checkpoints %v; start it with: ctr -n %s tasks start -d %s\n",
			res.Sandbox, res.Ref, res.Checkpoints, e.Namespace, res.Sandbox)
		return nil
	}
	names, err := oci.Load(ctx, cc, f, sn)
	if err != nil {
		return err
	}
	if e.JSON {
		return branchctl.PrintJSON(stdout, map[string]any{"images": names})
	}
	for _, n := range names {
		fmt.Fprintf(stdout, "loaded %s\n", n)
	}
	return nil
}

// cmdPull: pull REF SANDBOX [--plain-http] [--hosts-dir DIR]
// [--user USER[:SECRET]] [-- CMD...].
func cmdPull(c *cli.Context, e branchctl.Env) error {
	ctx, stdout := c.Context, e.Stdout
	remote := remoteOf(c)
	pos, cmd := branchctl.Args(c)
	if len(pos) != 2 {
		return fmt.Errorf("want pull REF SANDBOX [-- CMD...], got %q: %w", pos, errdefs.ErrInvalidArgument)
	}
	cc, err := dialContainerd(e.Address)
	if err != nil {
		return err
	}
	defer cc.Close()
	res, err := oci.Pull(namespaces.WithNamespace(ctx, e.Namespace), cc, pos[0], pos[1], remote, cmd...)
	if err != nil {
		return err
	}
	if e.JSON {
		return branchctl.PrintJSON(stdout, map[string]any{"ref": res.Ref, "sandbox": res.Sandbox, "checkpoints": res.Checkpoints})
	}
	fmt.Fprintf(stdout, "made sandbox %s of %s with checkpoints %v; start it with: ctr -n %s tasks start -d %s\n",
		res.Sandbox, res.Ref, res.Checkpoints, e.Namespace, res.Sandbox)
	return nil
}

// remoteOf reads remoteFlags.
func remoteOf(c *cli.Context) oci.Remote {
	r := oci.Remote{PlainHTTP: c.Bool("plain-http"), HostsDir: c.String("hosts-dir")}
	r.User, r.Secret, _ = strings.Cut(c.String("user"), ":")
	return r
}

// dialContainerd connects to containerd's full client at the address the
// flags gave.
func dialContainerd(address string) (*containerd.Client, error) {
	cc, err := containerd.New(address)
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", address, err)
	}
	return cc, nil
}
