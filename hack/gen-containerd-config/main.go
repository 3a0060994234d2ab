// Command gen-containerd-config prints the containerd configuration for
// branchbox (see package containerdconfig) on standard output.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/branchbox/branchbox/hack/containerdconfig"
)

func main() {
	var o containerdconfig.Options
	flag.StringVar(&o.SnapshotterAddress, "snapshotter-address", containerdconfig.DefaultSnapshotterAddress, "the branch snapshotter's socket")
	flag.StringVar(&o.Platform, "platform", "", "platform of the unpack entries (default linux/GOARCH of this build)")
	flag.StringVar(&o.SandboxImage, "sandbox-image", "", "CRI pause image (default: containerd's)")
	flag.StringVar(&o.ShimPath, "shim-path", containerdconfig.DefaultShimPath, "absolute path of the installed containerd-shim-branch-v1, which the CRI handler runs")
	flag.BoolVar(&o.CgroupfsDriver, "cgroupfs", false, "SystemdCgroup = false in the CRI handler's options, for nodes whose kubelet uses cgroupDriver: cgroupfs")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: gen-containerd-config [--snapshotter-address PATH] [--platform linux/ARCH] [--sandbox-image REF] [--shim-path PATH] [--cgroupfs]")
		os.Exit(2)
	}
	fmt.Print(containerdconfig.Render(o))
}
