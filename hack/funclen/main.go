// Command funclen fails on code too long to read at once (issue 30): any
// non-test, non-generated Go file over -file lines, anywhere in the
// repository, and any function over -func lines in the packages on the
// fork, commit, abort and rollback paths (-pkgs). A function's length is
// from its func keyword to its closing brace, its closures included; a
// file's, its lines. Generated files are those Go marks so ("Code
// generated ... DO NOT EDIT."), such as the protobuf code of api/.
// Directories of other modules (a go.mod of their own), testdata, vendor
// and node_modules are not the project's code and are not read.
//
//	cd hack/funclen && go run . -C ../..
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// pathPkgs are the packages a fork, a commit, an abort or a rollback runs
// through, in the shim, the snapshotter and the clients.
const pathPkgs = "shim/sandbox,shim/initdriver,shim/cgroup,shim/brinit," +
	"snapshotter,snapshotter/overlay,snapshotter/apply,snapshotter/layer," +
	"branch,client,client/branchapi,shim/ocirt"

// exempt are the functions over the limit that are left as they are for
// now, each with its length when listed: path/in/repo.go:Recv.Method or
// path:Func. Temporary; a function here that is no longer over the limit
// (or gone) fails the check too, so that the list only shrinks.
var exempt = map[string]int{}

func main() {
	dir := flag.String("C", ".", "the repository's root")
	maxFile := flag.Int("file", 600, "the most lines a non-test, non-generated Go file may have")
	maxFunc := flag.Int("func", 80, "the most lines a function of -pkgs may have")
	pkgs := flag.String("pkgs", pathPkgs, "the packages (directories from the root, comma-separated) whose functions are checked")
	verbose := flag.Bool("v", false, "list the longest functions of -pkgs and the longest files, over the limits or not")
	flag.Parse()
	bad, err := check(*dir, *maxFile, *maxFunc, strings.Split(*pkgs, ","), *verbose)
	if err != nil {
		fmt.Fprintln(os.Stderr, "funclen:", err)
		os.Exit(2)
	}
	if len(bad) > 0 {
		for _, b := range bad {
			fmt.Println(b)
		}
		os.Exit(1)
	}
}

type length struct {
	where string
	lines int
}

func check(root string, maxFile, maxFunc int, pkgs []string, verbose bool) ([]string, error) {
	onPath := map[string]bool{}
	for _, p := range pkgs {
		onPath[filepath.Clean(strings.TrimSpace(p))] = true
	}
	var files, funcs []length
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return skipDir(path, rel, d.Name())
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		files = append(files, length{rel, fset.File(f.Pos()).LineCount()})
		if onPath[filepath.Dir(rel)] {
			funcs = append(funcs, funcLengths(fset, rel, f)...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if verbose {
		list("files", files, 10)
		list("functions", funcs, 20)
	}
	var bad []string
	for _, f := range files {
		if f.lines > maxFile {
			bad = append(bad, fmt.Sprintf("%s: %d lines, over %d (split it along its concepts)", f.where, f.lines, maxFile))
		}
	}
	seen := map[string]bool{}
	for _, f := range funcs {
		seen[f.where] = true
		if f.lines <= maxFunc {
			continue
		}
		if _, ok := exempt[f.where]; ok {
			continue
		}
		bad = append(bad, fmt.Sprintf("%s: %d lines, over %d", f.where, f.lines, maxFunc))
	}
	for where, n := range exempt {
		if !seen[where] {
			bad = append(bad, fmt.Sprintf("%s: exempt (%d lines) but not found: take it off the list in hack/funclen/main.go", where, n))
		}
	}
	for _, f := range funcs {
		if _, ok := exempt[f.where]; ok && f.lines <= maxFunc {
			bad = append(bad, fmt.Sprintf("%s: exempt but %d lines now: take it off the list in hack/funclen/main.go", f.where, f.lines))
		}
	}
	sort.Strings(bad)
	return bad, nil
}

// skipDir says whether the walk enters a directory: not into another
// module, nor into what is not the project's Go code.
func skipDir(path, rel, name string) error {
	if rel == "." {
		return nil
	}
	switch name {
	case ".git", "testdata", "vendor", "node_modules":
		return filepath.SkipDir
	}
	if rel == "bin" || strings.HasPrefix(name, "_") {
		return filepath.SkipDir
	}
	if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
		return filepath.SkipDir
	}
	return nil
}

// funcLengths are the lengths of a file's functions and methods, named
// path:Func or path:Recv.Method.
func funcLengths(fset *token.FileSet, rel string, f *ast.File) []length {
	var out []length
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		name := fd.Name.Name
		if fd.Recv != nil && len(fd.Recv.List) == 1 {
			name = recvName(fd.Recv.List[0].Type) + "." + name
		}
		lines := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
		out = append(out, length{filepath.ToSlash(rel) + ":" + name, lines})
	}
	return out
}

func recvName(t ast.Expr) string {
	switch t := t.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

func list(what string, ls []length, n int) {
	s := append([]length(nil), ls...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].lines > s[j].lines })
	if len(s) > n {
		s = s[:n]
	}
	fmt.Printf("the longest %s:\n", what)
	for _, l := range s {
		fmt.Printf("  %5d %s\n", l.lines, l.where)
	}
}
