// Command gen-containerd-config prints the containerd configuration for
// branchbox (see package internal/containerdconfig) on standard output: the
// node configuration by default, or with --root, --state and --address a
// private containerd's beside the host's (docs/private-containerd.md).
package main

import (
	"github.com/branchbox/branchbox/branch"

	"flag"
	"fmt"
	"os"

	"github.com/branchbox/branchbox/internal/containerdconfig"
)

func main() {
	var o containerdconfig.Options
	var noCRI bool
	flag.StringVar(&o.SnapshotterAddress, "snapshotter-address", branch.DefaultSnapshotterAddress, "the branch snapshotter's socket")
	flag.StringVar(&o.SnapshotterRoot, "snapshotter-root", containerdconfig.DefaultSnapshotterRoot, "the branch snapshotter's --root, whose filesystem the CRI reports to the kubelet")
	flag.StringVar(&o.Platform, "platform", "", "platform of the unpack entries (default linux/GOARCH of this build)")
	flag.StringVar(&o.SandboxImage, "sandbox-image", "", "CRI pause image (default: containerd's)")
	flag.StringVar(&o.ShimPath, "shim-path", containerdconfig.DefaultShimPath, "absolute path of the installed containerd-shim-branch-v1, which the CRI handler runs")
	flag.BoolVar(&o.CRIDefaultBranch, "cri-default-branch", false, "make branch the CRI's default snapshotter, for every pod: containerd's CRI reports a container's writable layer (the kubelet's ephemeral-storage limits and eviction) only for its default snapshotter")
	flag.BoolVar(&o.CgroupfsDriver, "cgroupfs", false, "SystemdCgroup = false in the CRI handler's options, for nodes whose kubelet uses cgroupDriver: cgroupfs")
	flag.StringVar(&o.Root, "root", "", "containerd's root directory (default: containerd's, /var/lib/containerd)")
	flag.StringVar(&o.State, "state", "", "containerd's state directory (default: containerd's, /run/containerd); the branch shim keeps its state under it")
	flag.StringVar(&o.Address, "address", "", "containerd's gRPC socket (default: containerd's, /run/containerd/containerd.sock); its ttrpc socket is this + .ttrpc")
	flag.BoolVar(&noCRI, "no-cri", false, "leave the CRI and NRI plugins out (a private containerd beside a node's, which would otherwise contend for CNI and ports)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: gen-containerd-config [--snapshotter-address PATH] [--platform linux/ARCH] [--sandbox-image REF] [--shim-path PATH] [--cgroupfs] [--cri-default-branch] [--root DIR --state DIR --address SOCK] [--no-cri]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	if noCRI {
		o.DisabledPlugins = containerdconfig.CRIPlugins()
	}
	fmt.Print(containerdconfig.Render(o))
}
