//go:build linux

package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// critestSkips are the critest specs neither handler runs, each with why
// (docs/critest.md lists them too; TestCritestDocs checks it does).
var critestSkips = map[string]string{
	"public image with digest should be pulled and removed": "its image is named by a digest of gcr.io's copy, which no local build reproduces",
	// containerd v2.2.1's ListPodSandboxMetrics dereferences a container's
	// unset memory reservation (list_pod_sandbox_metrics_linux.go:1026,
	// the CRI's own code, whatever the handler): with the systemd driver
	// on cgroup v2 it panicked, and every spec after it failed; elsewhere
	// it returns no metrics, and the spec fails on both handlers.
	"runtime should support listing pod sandbox metrics": "containerd v2.2.1 panics on it (cgroup v2, systemd driver) or returns no metrics",
	// These fetch a web page from the host at the pod's address.
	"runtime should support port mapping with":                         "the tests' pod network (a CNI plugin of their own) is not reachable from the host",
	"runtime should support portforward [Conformance]":                 "it fetches the web server's page at the pod's address first, which the host cannot reach",
	"when running multiple containers in a pod should support network": "it fetches the web server's page at the pod's address, which the host cannot reach",
}

// critestImage is an image critest pulls, rebuilt here: its name in
// critest (registry, path and tag), what it holds beyond busybox, and its
// configuration.
type critestImage struct {
	ref    string
	files  map[string]critestFile
	config ocispec.ImageConfig
	// noBase leaves busybox out (the nonewprivs image is one binary).
	noBase bool
}

type critestFile struct {
	mode int64
	data []byte
}

// critestImages are the images critest v1.37.0 pulls (pkg/validate and
// pkg/framework name them), rebuilt from busybox with what each spec
// looks for: nginx's "master process" in its PID 1's command line and
// its pid file, web servers on port 80, image users and groups, a
// set-user-id program that prints its effective uid.
func critestImages(nnp, tools, busybox []byte) []critestImage {
	passwd := "root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/bin/sh\ndefault-user:x:1000:1000::/home:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
	group := "root:x:0:\nwww-data:x:33:\ndefault-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\nusers:x:100:\nnogroup:x:65534:\n"
	users := map[string]critestFile{"etc/passwd": {0o644, []byte(passwd)}, "etc/group": {0o644, []byte(group)}}
	page := map[string]critestFile{"www/index.html": {0o644, []byte("<html>branchbox critest</html>\n")}}
	tool := critestFile{0o755, tools}
	// pgrep and ipcs, in every busybox image (critest runs them in its
	// default image), and ls a file of its own, not a link to busybox, as
	// in busybox's images: the MaskedPaths spec masks /bin/ls, which masks
	// busybox itself, sh included, when ls is a symbolic link to it.
	withTools := func(files map[string]critestFile) map[string]critestFile {
		out := map[string]critestFile{"bin/pgrep": tool, "bin/ipcs": tool, "bin/ls": {0o755, busybox}}
		for k, v := range files {
			out[k] = v
		}
		return out
	}
	const e2e, cri = "registry.k8s.io/e2e-test-images/", "gcr.io/k8s-staging-cri-tools/"
	sh := ocispec.ImageConfig{Env: []string{"PATH=/bin"}, Cmd: []string{"sh"}}
	with := func(user string) ocispec.ImageConfig { c := sh; c.User = user; return c }
	marked := func(i int) map[string]critestFile {
		return map[string]critestFile{"image": {0o644, []byte(fmt.Sprintf("image %d\n", i))}}
	}
	var imgs []critestImage
	add := func(ref string, files map[string]critestFile, config ocispec.ImageConfig) {
		imgs = append(imgs, critestImage{ref: ref, files: withTools(files), config: config})
	}
	add(e2e+"busybox:1.29-2", nil, sh)
	add(e2e+"nginx:1.14-2", map[string]critestFile{"usr/sbin/nginx": tool, "www/index.html": page["www/index.html"]},
		ocispec.ImageConfig{Env: []string{"PATH=/bin:/usr/sbin"}, Entrypoint: []string{"/usr/sbin/nginx"}})
	// The host-network port forward spec's, on its port.
	add(cri+"hostnet-nginx-"+runtime.GOARCH+":latest", map[string]critestFile{"usr/sbin/nginx": tool, "www/index.html": page["www/index.html"]},
		ocispec.ImageConfig{Env: []string{"PATH=/bin:/usr/sbin", "PORT=12003"}, Entrypoint: []string{"/usr/sbin/nginx"}})
	add(e2e+"httpd:2.4.39-4", map[string]critestFile{"usr/sbin/httpd": tool, "www/index.html": page["www/index.html"]},
		ocispec.ImageConfig{Env: []string{"PATH=/bin:/usr/sbin"}, Entrypoint: []string{"/usr/sbin/httpd"}})
	imgs = append(imgs, critestImage{ref: e2e + "nonewprivs:1.3", noBase: true,
		files:  map[string]critestFile{"usr/local/bin/nnp": {0o4755, nnp}},
		config: ocispec.ImageConfig{Entrypoint: []string{"/usr/local/bin/nnp"}}})
	add(cri+"test-image-latest:latest", marked(0), sh)
	add(cri+"test-image-tag:test", marked(0), sh)
	add(cri+"test-image-tag:all", marked(0), sh)
	for i := 1; i <= 3; i++ {
		add(fmt.Sprintf("%stest-image-%d:latest", cri, i), marked(i), sh)
		add(fmt.Sprintf("%stest-image-tags:%d", cri, i), marked(10), sh)
	}
	add(cri+"test-image-user-uid:latest", users, with("1002"))
	add(cri+"test-image-user-username:latest", users, with("www-data"))
	add(cri+"test-image-user-uid-group:latest", users, with("1003:users"))
	add(cri+"test-image-user-username-group:latest", users, with("www-data:www-data"))
	add(cri+"test-image-predefined-group:latest", users, with("1000"))
	add("registry.k8s.io/pause:3.9", nil, ocispec.ImageConfig{Env: []string{"PATH=/bin"}, Entrypoint: []string{"sleep", "infinity"}})
	add("k8s.gcr.io/pause:3.9", nil, ocispec.ImageConfig{Env: []string{"PATH=/bin"}, Entrypoint: []string{"sleep", "infinity"}})
	return imgs
}

// critestToolsSource is one static program for what busybox (Debian's
// busybox-static) lacks and critest's specs run, chosen by the name it is
// run as: pgrep and ipcs (-m) as procps and util-linux print them, and
// the web servers of the nginx and httpd images: nginx re-executes itself
// as "nginx: master process ..." (its PID 1's command line, which the PID
// namespace specs read; its comm stays nginx, which pidof finds) and
// writes /var/run/nginx.pid; httpd logs a line naming itself.
const critestToolsSource = `package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
)

func main() {
	name := filepath.Base(os.Args[0])
	switch {
	case name == "pgrep":
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		re := regexp.MustCompile(os.Args[1])
		dirs, _ := filepath.Glob("/proc/[0-9]*/comm")
		found := false
		for _, d := range dirs {
			b, err := os.ReadFile(d)
			if err == nil && re.MatchString(strings.TrimSpace(string(b))) {
				fmt.Println(filepath.Base(filepath.Dir(d)))
				found = true
			}
		}
		if !found {
			os.Exit(1)
		}
	case name == "ipcs":
		b, _ := os.ReadFile("/proc/sysvipc/shm")
		fmt.Println("\n------ Shared Memory Segments --------")
		fmt.Println("key        shmid      owner      perms      bytes      nattch     status")
		for i, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Fields(l)
			if i == 0 || len(f) < 7 {
				continue
			}
			var key int64
			fmt.Sscan(f[0], &key)
			fmt.Printf("0x%08x %-10s %-10s %-10s %-10s %-10s\n", uint32(key), f[1], f[7], f[2], f[3], f[6])
		}
	case name == "nginx":
		self, _ := os.Executable()
		syscall.Exec(self, []string{"nginx: master process nginx -g daemon off;"}, os.Environ())
		os.Exit(1)
	case strings.Contains(name, "master process"):
		os.MkdirAll("/var/run", 0o755)
		os.WriteFile("/var/run/nginx.pid", []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644)
		serve()
	case name == "httpd":
		fmt.Println("httpd: serving /www on port 80")
		serve()
	}
}

func serve() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "80"
	}
	if err := http.ListenAndServe(":"+port, http.FileServer(http.Dir("/www"))); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
`

// nnpSource is the nonewprivs image's program, set-user-id root: it
// prints the effective uid it runs with.
const nnpSource = `package main

import (
	"fmt"
	"os"
)

func main() { fmt.Printf("Effective uid: %d\n", os.Geteuid()) }
`

// critestRegistry starts a loopback registry holding critestImages under
// their paths, and returns the CRI's registry hosts directory that makes
// it the mirror of registry.k8s.io, gcr.io and k8s.gcr.io.
func critestRegistry(t *testing.T, c *criTest, reg *daemons.Registry) {
	t.Helper()
	nnp, tools := buildStatic(t, nnpSource), buildStatic(t, critestToolsSource)
	busybox, err := os.ReadFile(ociimage.BusyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	base, err := ociimage.BusyboxLayer()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for i, img := range critestImages(nnp, tools, busybox) {
		_, path, _ := strings.Cut(img.ref, "/")
		local := reg.Ref(path)
		var layers [][]byte
		if !img.noBase {
			layers = append(layers, base)
		}
		names := make([]string, 0, len(img.files))
		for n := range img.files {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			l, err := ociimage.FileLayer(n, img.files[n].mode, img.files[n].data)
			if err != nil {
				t.Fatal(err)
			}
			layers = append(layers, l)
		}
		archive := filepath.Join(dir, fmt.Sprintf("%d.tar", i))
		f, err := os.Create(archive)
		if err != nil {
			t.Fatal(err)
		}
		err = ociimage.WriteImage(f, local, img.config, layers...)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		// Through containerd's own push, from a namespace of the env's.
		if _, err := c.env.Ctr(c.ctx, "images", "import", "--no-unpack", archive); err != nil {
			t.Fatal(err)
		}
		if _, err := c.env.Ctr(c.ctx, "images", "push", "--plain-http", local); err != nil {
			t.Fatal(err)
		}
	}
}

// critestHosts writes the registry hosts directory that mirrors critest's
// registries to the loopback one.
func critestHosts(t *testing.T, host string) string {
	t.Helper()
	dir := t.TempDir()
	for _, r := range []string{"registry.k8s.io", "gcr.io", "k8s.gcr.io"} {
		if err := os.MkdirAll(filepath.Join(dir, r), 0o755); err != nil {
			t.Fatal(err)
		}
		hosts := fmt.Sprintf("server = \"https://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", r, host)
		if err := os.WriteFile(filepath.Join(dir, r, "hosts.toml"), []byte(hosts), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// buildStatic builds a Go program, static, and returns the binary.
func buildStatic(t *testing.T, source string) []byte {
	t.Helper()
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "main.go"), filepath.Join(dir, "prog")
	if err := os.WriteFile(src, []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, src)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// ginkgoReport is the part of a ginkgo JSON report the comparison reads.
type ginkgoReport []struct {
	SpecReports []struct {
		ContainerHierarchyTexts []string
		LeafNodeText            string
		LeafNodeType            string
		State                   string
	}
}

// critestResults runs critest on one runtime handler and returns each
// spec's state (passed, failed, skipped, ...), by its full text.
func critestResults(t *testing.T, c *criTest, handler, skip string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	report := filepath.Join(dir, "report.json")
	cfg := filepath.Join(dir, "crictl.yaml")
	if err := os.WriteFile(cfg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	endpoint := "unix://" + c.env.Address
	args := []string{"-config", cfg, "-runtime-endpoint", endpoint, "-image-endpoint", endpoint,
		"-runtime-handler", handler,
		"-ginkgo.json-report", report, "-ginkgo.no-color", "-ginkgo.skip", skip,
		// A spec that fails once and passes on its retry counts as passed,
		// on both handlers alike.
		"-ginkgo.flake-attempts", "2"}
	if daemons.Emulated() {
		// ginkgo's own bound on a run is an hour; go test's -timeout
		// bounds it there.
		args = append(args, "-ginkgo.timeout", "4h")
	}
	// Not c.ctx, whose 5 minutes bound an env's start: a run takes longer.
	cmd := exec.CommandContext(t.Context(), filepath.Join(c.env.BinDir, "critest"), args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// critest exits non-zero when a spec fails; the report says which.
	runErr := cmd.Run()
	// What failed, told if the comparison fails (the output goes with
	// the test's directory).
	t.Cleanup(func() {
		if t.Failed() {
			text := out.String()
			if i := strings.Index(text, "Summarizing"); i >= 0 {
				text = text[i:]
			}
			t.Logf("critest on %s:\n%s", handler, lastLines(text, 60))
		}
	})
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("critest on %s wrote no report (%v): %v\n%s", handler, runErr, err, lastLines(out.String(), 40))
	}
	var r ginkgoReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, suite := range r {
		for _, s := range suite.SpecReports {
			if s.LeafNodeType != "It" {
				continue
			}
			name := strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " ")
			states[name] = s.State
		}
	}
	if len(states) == 0 {
		t.Fatalf("critest on %s ran no specs (%v):\n%s", handler, runErr, lastLines(out.String(), 40))
	}
	t.Logf("critest on %s: %s", handler, countStates(states))
	return states
}

func countStates(states map[string]string) string {
	n := map[string]int{}
	for _, s := range states {
		n[s]++
	}
	var keys []string
	for k := range n {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, n[k]))
	}
	return strings.Join(parts, ", ")
}

// critestAllowed reads the allowed differences from docs/critest.md: the
// rows of its table "Differences" (| spec | runc | branch | why |).
func critestAllowed(t *testing.T) map[string][2]string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "docs", "critest.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	allowed := map[string][2]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.HasPrefix(line, "## Differences")
			continue
		}
		if !in || !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| Spec") || strings.HasPrefix(line, "|--") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 4 || strings.TrimSpace(cells[3]) == "" {
			t.Fatalf("docs/critest.md: a difference needs its spec, both states and why: %q", line)
		}
		allowed[strings.Trim(cells[0], "`")] = [2]string{cells[1], cells[2]}
	}
	return allowed
}

// critestSkipRegexp is the -ginkgo.skip of both runs.
func critestSkipRegexp() string {
	var parts []string
	for s := range critestSkips {
		parts = append(parts, regexp.QuoteMeta(s))
	}
	sort.Strings(parts)
	return strings.Join(parts, "|")
}

// TestCritest runs critest v1.37.0 against one containerd on the runc and
// the branch handlers and compares the results spec by spec: the same
// specs pass, fail and are skipped on both, but for the differences
// docs/critest.md lists with their reasons. critest's images come from a
// loopback registry that mirrors its registries, rebuilt here.
func TestCritest(t *testing.T) {
	requireKubernetesFull(t)
	// critest's pods have no cgroup parent: the runtimes put them under
	// /k8s.io on every hierarchy, a level they never remove.
	var k8sLevels []string
	for _, d := range append([]string{"/sys/fs/cgroup"}, globOrNil("/sys/fs/cgroup/*")...) {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			continue
		}
		d = filepath.Join(d, "k8s.io")
		if _, err := os.Stat(d); err != nil {
			k8sLevels = append(k8sLevels, d)
		}
	}
	t.Cleanup(func() {
		for _, d := range k8sLevels {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				t.Errorf("critest's cgroup level %s: %v", d, err)
			}
		}
	})
	// The HostIpc specs make shared memory segments on the host (ipcmk)
	// and leave them: those made while critest ran go at the end.
	shmBefore := shmIDs()
	t.Cleanup(func() {
		for id := range shmIDs() {
			if !shmBefore[id] {
				if out, err := exec.Command("ipcrm", "-m", id).CombinedOutput(); err != nil {
					t.Errorf("remove critest's shared memory segment %s: %v %s", id, err, out)
				}
			}
		}
	})
	reg, err := daemons.StartRegistry(t.Context(), daemons.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop() })
	hosts := critestHosts(t, reg.Host)
	// The driver of a kubeadm-style node where systemd is the init (the
	// cgroup v2 VM): critest's pods then go into slices.
	sd := systemdNode()
	// The runc handler on the runc of the libcontainer the branch runtime
	// links: Debian's 1.1 lacks id-mapped mounts, and critest's user
	// namespace specs would run on one handler only.
	c := criEnvWith(t, daemons.CRIConfig{RegistryConfigPath: hosts, SystemdCgroup: sd, RuncSystemdCgroup: sd, RuncBinary: upstreamRunc(t)})
	// The env's context ends 5 minutes after its start; building and
	// pushing the images takes longer than that under emulation.
	c.ctx = context.WithoutCancel(c.ctx)
	critestRegistry(t, c, reg)
	allowed := critestAllowed(t)
	skip := critestSkipRegexp()
	runc := critestResults(t, c, "runc", skip)
	branch := critestResults(t, c, "branch", skip)
	names := map[string]bool{}
	for n := range runc {
		names[n] = true
	}
	for n := range branch {
		names[n] = true
	}
	var sorted []string
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	for _, n := range sorted {
		r, b := runc[n], branch[n]
		if r == "" || b == "" {
			t.Errorf("spec %q ran on one handler only (runc %q, branch %q)", n, r, b)
			continue
		}
		if r == b {
			continue
		}
		if a, ok := allowed[n]; ok && a == [2]string{r, b} {
			t.Logf("allowed difference (docs/critest.md): %q: runc %s, branch %s", n, r, b)
			continue
		}
		t.Errorf("spec %q: runc %s, branch %s (not an allowed difference of docs/critest.md)", n, r, b)
	}
	for n := range allowed {
		if !names[n] {
			t.Errorf("docs/critest.md allows a difference for %q, which critest does not have", n)
		}
	}
	// Which specs fail on both, for the record (docs/critest.md says why).
	var both []string
	for _, n := range sorted {
		if runc[n] == "failed" && branch[n] == "failed" {
			both = append(both, n)
		}
	}
	if len(both) > 0 {
		t.Logf("failed on both handlers:\n%s", strings.Join(both, "\n"))
	}
}

// shmIDs lists the host's System V shared memory segments.
func shmIDs() map[string]bool {
	ids := map[string]bool{}
	b, _ := os.ReadFile("/proc/sysvipc/shm")
	for i, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); i > 0 && len(f) > 1 {
			ids[f[1]] = true
		}
	}
	return ids
}

func globOrNil(pattern string) []string {
	m, _ := filepath.Glob(pattern)
	return m
}

// TestCritestDocs checks that docs/critest.md names every spec both
// handlers skip.
func TestCritestDocs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "docs", "critest.md"))
	if err != nil {
		t.Fatal(err)
	}
	// (As a reader sees it: lines wrap anywhere.)
	doc := strings.Join(strings.Fields(string(b)), " ")
	for s := range critestSkips {
		if !strings.Contains(doc, s) {
			t.Errorf("docs/critest.md does not name the skipped spec %q", s)
		}
	}
}
