// Command busybox-image writes a small OCI image archive holding the
// host's static busybox (Debian's busybox-static) as
// docker.io/branchbox/busybox:test, for machines that reach no registry
// (make image; docs/private-containerd.md). ctr images import takes it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/branchbox/branchbox/internal/ociimage"
)

func main() {
	out := flag.String("o", "busybox.tar", "the archive to write")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: busybox-image [-o FILE]")
		os.Exit(2)
	}
	if err := ociimage.WriteBusyboxImageFile(*out); err != nil {
		fmt.Fprintln(os.Stderr, "busybox-image:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: %s (import with: ctr images import --snapshotter branch %s)\n", *out, ociimage.ImageRef, *out)
}
