package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// PythonPath is Debian's python3 (package python3.11-minimal and
// libpython3.11-stdlib), which the Python test image carries.
const (
	PythonPath   = "/usr/bin/python3.11"
	PythonStdlib = "/usr/lib/python3.11"
)

// PythonImageRef is the name the Python test image is imported under.
const PythonImageRef = "docker.io/branchbox/python:test"

// pythonSkip are parts of the standard library no test uses, left out to
// keep the layer small.
var pythonSkip = map[string]bool{
	"test": true, "idlelib": true, "tkinter": true, "turtledemo": true, "ensurepip": true,
	"lib2to3": true, "pydoc_data": true, "distutils": true, "site-packages": true, "dist-packages": true,
}

// PythonLayer is a layer (an uncompressed tar) with the host's Debian
// python3 at /usr/bin/python3, its standard library, and every shared
// library the interpreter and its extension modules link, at their paths:
// put over BusyboxLayer, a Python REPL runs in a sandbox of it.
func PythonLayer() ([]byte, error) {
	if _, err := os.Stat(PythonPath); err != nil {
		return nil, fmt.Errorf("%s (install Debian's python3): %w", PythonPath, err)
	}
	files := map[string]string{"usr/bin/python3": PythonPath}
	objects := []string{PythonPath}
	err := filepath.WalkDir(PythonStdlib, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && pythonSkip[d.Name()] {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			files[strings.TrimPrefix(p, "/")] = p
			if strings.HasSuffix(p, ".so") {
				objects = append(objects, p)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, o := range objects {
		libs, err := sharedLibs(o)
		if err != nil {
			return nil, err
		}
		for _, l := range libs {
			files[strings.TrimPrefix(l, "/")] = l
		}
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, n := range names {
		parts := strings.Split(n, "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/") + "/"
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
		src := files[n]
		fi, err := os.Stat(src)
		if err != nil {
			return nil, err
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		if err := writeFile(tw, n, int64(fi.Mode().Perm()), data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// sharedLibs lists the shared libraries an ELF object loads, its dynamic
// loader included, as ldd resolves them on this host.
func sharedLibs(object string) ([]string, error) {
	out, err := exec.Command("ldd", object).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", object, err)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	return libs, nil
}
