//go:build linux

package ocirt

// A sandbox rolled back to a checkpoint with memory keeps its container:
// the shim deletes the runtime's container of its old processes and
// restores the checkpoint's under the same id and bundle. To the hooks
// (nerdctl's networking, and any other) that is one container that lives
// on, so with KeptNetNSFile in the bundle the delete runs no poststop hook
// and the restore no create hook, joins the network namespace kept there
// instead of making one, and records the spec's hooks for the final delete.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	"github.com/opencontainers/runc/libcontainer/utils"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// KeptNetNSFile, in a sandbox's bundle, is the network namespace of its
// processes, bind mounted there by the shim while it replaces them.
const KeptNetNSFile = "netns-kept"

// keptNetNS is the network namespace a bundle keeps for a replacement of
// its processes, or "" if it keeps none (a plain file is not one).
func keptNetNS(bundle string) string {
	p := filepath.Join(bundle, KeptNetNSFile)
	var fs unix.Statfs_t
	if err := unix.Statfs(p, &fs); err != nil || fs.Type != unix.NSFS_MAGIC {
		return ""
	}
	return p
}

// joinKeptNetNS adjusts a restore's spec to a replacement's (keptNetNS is
// its namespace): no hook runs, the namespace is joined. It returns the
// hooks taken out, for recordHooks.
func joinKeptNetNS(spec *specs.Spec, netns string) *specs.Hooks {
	hooks := spec.Hooks
	spec.Hooks = nil
	if spec.Linux == nil {
		spec.Linux = &specs.Linux{}
	}
	ns := spec.Linux.Namespaces[:0:0]
	for _, n := range spec.Linux.Namespaces {
		if n.Type != specs.NetworkNamespace {
			ns = append(ns, n)
		}
	}
	spec.Linux.Namespaces = append(ns, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: netns})
	return hooks
}

// recordHooks puts a spec's hooks into the state of container id, created
// without them (joinKeptNetNS), so that its delete runs the poststop ones.
func recordHooks(c *cmdline, spec *specs.Spec, hooks *specs.Hooks) error {
	if hooks == nil {
		return nil
	}
	withHooks := *spec
	withHooks.Hooks = hooks
	config, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName:       c.args[0],
		UseSystemdCgroup: c.g.systemd,
		Spec:             &withHooks,
	})
	if err != nil {
		return fmt.Errorf("record the container's hooks: %w", err)
	}
	return setStateHooks(c.g.root, c.args[0], config.Hooks)
}

// dropHooksIfKept takes the hooks out of the state of container id when
// its bundle keeps its network namespace for a replacement: its delete is
// not the end of the container the hooks set up.
func dropHooksIfKept(c *cmdline, bundle string) error {
	if bundle == "" || keptNetNS(bundle) == "" {
		return nil
	}
	return setStateHooks(c.g.root, c.args[0], nil)
}

// setStateHooks rewrites the hooks in the state libcontainer keeps for
// container id (its config's "hooks"), in place of a file replaced whole.
func setStateHooks(root, id string, hooks configs.Hooks) error {
	path := filepath.Join(root, id, "state.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var state map[string]json.RawMessage
	if err := json.Unmarshal(b, &state); err != nil {
		return fmt.Errorf("container state %s: %w", id, err)
	}
	var config map[string]json.RawMessage
	if err := json.Unmarshal(state["config"], &config); err != nil {
		return fmt.Errorf("container state %s: config: %w", id, err)
	}
	h, err := json.Marshal(hooks)
	if err != nil {
		return err
	}
	config["hooks"] = h
	if state["config"], err = json.Marshal(config); err != nil {
		return err
	}
	if b, err = json.Marshal(state); err != nil {
		return err
	}
	tmp := path + ".hooks"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// bundleOf is the bundle a container was created from ("" if unknown).
func bundleOf(container *libcontainer.Container) string {
	bundle, _ := utils.Annotations(container.Config().Labels)
	return bundle
}
