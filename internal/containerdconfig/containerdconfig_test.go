package containerdconfig

import (
	"os"
	"strings"
	"testing"
)

// The documented configuration is the generator's output: regenerate it
// with `make containerd-config` after changing Render.
func TestDocsConfigIsGenerated(t *testing.T) {
	want := Render(Options{Platform: "linux/amd64"})
	got, err := os.ReadFile("../../docs/containerd-config.toml")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("docs/containerd-config.toml is not what `make containerd-config` generates; run it")
	}
}

// Private-daemon settings appear only when asked for; the node config
// leaves containerd's defaults alone.
func TestRenderOptional(t *testing.T) {
	node := Render(Options{})
	for _, s := range []string{"\nroot =", "\nstate =", "[grpc]", "disabled_plugins", "pinned_images", "netns_mounts_under_state_dir", "restrict_oom_score_adj", "conf_dir"} {
		if strings.Contains(node, s) {
			t.Errorf("node config sets %q", s)
		}
	}
	private := Render(Options{Root: "/r", State: "/s", Address: "/a.sock", SandboxImage: "p:1", CNIConfDir: "/c", NetNSUnderState: true, RestrictOOMScoreAdj: true, DisabledPlugins: []string{"x"}})
	for _, s := range []string{`root = "/r"`, `state = "/s"`, `address = "/a.sock.ttrpc"`, `sandbox = "p:1"`, `conf_dir = "/c"`, "netns_mounts_under_state_dir = true", "restrict_oom_score_adj = true", `disabled_plugins = ["x"]`} {
		if !strings.Contains(private, s) {
			t.Errorf("private config lacks %q:\n%s", s, private)
		}
	}
}

// The CRI handler is runc-v2's type running the branch shim by path, with
// the systemd cgroup driver unless asked for cgroupfs.
func TestRenderCRIHandler(t *testing.T) {
	node := Render(Options{})
	for _, s := range []string{
		`runtime_type = "io.containerd.runc.v2"`,
		`runtime_path = "` + DefaultShimPath + `"`,
		// The CRI reports the snapshotter's filesystem to the kubelet.
		`exports = { root = "` + DefaultSnapshotterRoot + `" }`,
		`[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.branch.options]` + "\n  SystemdCgroup = true\n",
	} {
		if !strings.Contains(node, s) {
			t.Errorf("node config lacks %q:\n%s", s, node)
		}
	}
	other := Render(Options{ShimPath: "/opt/bbx/bin/containerd-shim-branch-v1", CgroupfsDriver: true, SnapshotterRoot: "/srv/bbx"})
	for _, s := range []string{`runtime_path = "/opt/bbx/bin/containerd-shim-branch-v1"`, "SystemdCgroup = false\n", `exports = { root = "/srv/bbx" }`} {
		if !strings.Contains(other, s) {
			t.Errorf("config with ShimPath and CgroupfsDriver lacks %q:\n%s", s, other)
		}
	}
}
