// Command walk lists the files a fork request reaches in the shim, in the
// order it reaches them, and counts them and the returns to a file it had
// left (docs/design.md, "a fork's path"). It walks the call graph from the
// handler statically: each function of the shim's packages that is called,
// in source order (deferred calls at their function's end), once; calls
// through interfaces and into other modules end the walk there, as do
// error paths and refusals, and function literals returned (run later by
// whoever holds them). Functions
// the ordinary fork does not run (a memory fork, the runtime's start, the
// undo of a failed fork, error reports) are named in -skip; one-statement
// accessors are not counted (-trivial counts them). A return is a call
// into a file the path had left; coming back from a call to the caller's
// file is not one (-unwind counts those too).
//
//	cd hack/walk && go run . -C ../..
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/tools/go/packages"
)

// defaultSkip is what `branchctl fork agent -n 2` does not run: it starts
// its branches with the branch init, makes no memory image and does not
// fail. Names are Recv.Method or Func, in any of the shim's packages.
const defaultSkip = "Service.undoFork,Service.dumpMemory,Service.checkMemoryFork,Service.checkpointImage,memoryImage.remove," +
	// once a sandbox: its first operation, the seccomp program's compile, its pool started ahead of its first fork
	"Service.prepare,Service.reconcile,Service.warm,Compile,Path.closeProg,sealedProgram,Program.Bytes,NewPool,PrepOf," +
	// other requests' options: an isolated network, the runtime's start,
	// --seal freeze or a parent with files open for writing, a command
	"makeIsolatedNetns,Service.runOnRuntime,writeSpec,FreezeOwn,isSelfFork,ownWriters,writersOutside,Service.readCgroup,WriteProc," +
	// refusals and discards: a parent gone, no room, an init that died,
	// ids used behind the shim's back (the inits taken ahead guessed wrong)
	"Sandbox.ref,Sandbox.pidsRefusal,PausedError,Spawned.Discard,fork.dropAhead," +
	// what the branch init reports over its branch's life, read by a
	// goroutine the fork starts and does not wait for
	"Branch.read"

func main() {
	dir := flag.String("C", ".", "the repository's root")
	root := flag.String("from", "sandbox.Service.Fork", "the handler: package.Recv.Method or package.Func")
	skip := flag.String("skip", defaultSkip, "functions not on the path, comma-separated")
	verbose := flag.Bool("v", false, "list each function entered")
	trivial := flag.Bool("trivial", false, "count one-statement functions that call nothing of the shim (accessors) as visits too")
	unwind := flag.Bool("unwind", false, "count coming back to a caller's file when a call ends as a return too, not only a new call into a file left")
	maxReturns := flag.Int("max-returns", -1, "fail if the path returns to a file it left more often than this (make check-walk: 0)")
	flag.Parse()
	returns, err := run(*dir, *root, *skip, *verbose, *trivial, *unwind)
	if err == nil && *maxReturns >= 0 && returns > *maxReturns {
		err = fmt.Errorf("the path returns to a file it left %d times, more than %d: a reader following it comes back to a file (docs/design.md, \"a fork's path\"; -v lists each function)", returns, *maxReturns)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "walk:", err)
		os.Exit(1)
	}
}

type walker struct {
	fset    *token.FileSet
	decls   map[*types.Func]*ast.FuncDecl
	infos   map[*types.Func]*types.Info
	skip    map[string]bool
	seen    map[*types.Func]bool
	files   []string // each file entered, in order, consecutive repeats merged
	verbose bool
	trivial bool
	unwind  bool
	base    string
}

func run(dir, root, skip string, verbose, trivial, unwind bool) (int, error) {
	cfg := &packages.Config{
		Mode:       packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo,
		Dir:        dir,
		BuildFlags: []string{"-tags", "seccomp"},
	}
	pkgs, err := packages.Load(cfg, "./shim/...")
	if err != nil {
		return 0, err
	}
	abs, _ := filepath.Abs(dir)
	w := &walker{fset: nil, decls: map[*types.Func]*ast.FuncDecl{}, infos: map[*types.Func]*types.Info{},
		skip: map[string]bool{}, seen: map[*types.Func]bool{}, verbose: verbose, trivial: trivial, unwind: unwind, base: abs}
	for _, s := range strings.Split(skip, ",") {
		if s != "" {
			w.skip[s] = true
		}
	}
	var start *types.Func
	for _, p := range pkgs {
		if len(p.Errors) > 0 {
			return 0, fmt.Errorf("%s: %v", p.PkgPath, p.Errors[0])
		}
		w.fset = p.Fset
		for _, f := range p.Syntax {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				fn, _ := p.TypesInfo.Defs[fd.Name].(*types.Func)
				if fn == nil {
					continue
				}
				w.decls[fn], w.infos[fn] = fd, p.TypesInfo
				if p.Name+"."+name(fn) == root {
					start = fn
				}
			}
		}
	}
	if start == nil {
		return 0, fmt.Errorf("%s not found", root)
	}
	handler := w.file(start)
	w.enter(start, "")
	files, returns, left := map[string]bool{}, 0, map[string]bool{}
	for i, f := range w.files {
		fmt.Println(f)
		if f == handler {
			continue
		}
		if left[f] {
			returns++
		}
		files[f] = true
		if i+1 < len(w.files) {
			left[f] = true
		}
	}
	fmt.Printf("%d files beyond %s, %d returns to a file left\n", len(files), handler, returns)
	return returns, nil
}

// name is Recv.Method or Func.
func name(fn *types.Func) string {
	sig := fn.Type().(*types.Signature)
	if r := sig.Recv(); r != nil {
		t := r.Type()
		if p, ok := t.(*types.Pointer); ok {
			t = p.Elem()
		}
		if n, ok := t.(*types.Named); ok {
			return n.Obj().Name() + "." + fn.Name()
		}
	}
	return fn.Name()
}

func (w *walker) file(fn *types.Func) string {
	p := w.fset.Position(w.decls[fn].Pos()).Filename
	if r, err := filepath.Rel(w.base, p); err == nil {
		return r
	}
	return p
}

func (w *walker) visit(f string) {
	if n := len(w.files); n == 0 || w.files[n-1] != f {
		w.files = append(w.files, f)
	}
}

// enter runs fn, called from a function of file from: its file (a visit
// if it is another), then the functions it calls in order.
func (w *walker) enter(fn *types.Func, from string) {
	w.seen[fn] = true
	f := w.file(fn)
	if !w.trivial && w.accessor(fn) {
		return
	}
	if f != from || w.unwind {
		w.visit(f)
	}
	if w.verbose {
		fmt.Fprintf(os.Stderr, "%s %s\n", f, name(fn))
	}
	info := w.infos[fn]
	var deferred []*ast.CallExpr
	var calls func(n ast.Node) bool
	calls = func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt:
			if failing(n.Cond) || refuses(n.Body) {
				// An error's path or a refusal, not the fork's: its
				// init and condition run, its body does not.
				if n.Init != nil {
					ast.Inspect(n.Init, calls)
				}
				ast.Inspect(n.Cond, calls)
				if n.Else != nil {
					ast.Inspect(n.Else, calls)
				}
				return false
			}
		case *ast.ReturnStmt:
			// A function literal returned is run later by whoever
			// holds it, if at all (a ttrpc interceptor runs for each
			// call on a branch's socket, not in the fork).
			for _, r := range n.Results {
				if _, lit := ast.Unparen(r).(*ast.FuncLit); !lit {
					ast.Inspect(r, calls)
				}
			}
			return false
		case *ast.DeferStmt:
			// The function value and the arguments are evaluated at
			// the defer (defer sb.active()() marks the sandbox active
			// there); the call, or a literal's body, at the end.
			for _, a := range n.Call.Args {
				ast.Inspect(a, calls)
			}
			if _, lit := ast.Unparen(n.Call.Fun).(*ast.FuncLit); !lit {
				ast.Inspect(n.Call.Fun, calls)
			}
			deferred = append(deferred, n.Call)
			return false
		case *ast.CallExpr:
			if w.skipped(info, n) {
				// Not on the path: nor are its arguments, evaluated
				// for it only (writeSpec(dir, runtimeSpec(...))).
				return false
			}
			for _, a := range n.Args { // arguments are evaluated first
				ast.Inspect(a, calls)
			}
			ast.Inspect(n.Fun, calls)
			w.call(info, n, f)
			return false
		}
		return true
	}
	ast.Inspect(w.decls[fn].Body, calls)
	for i := len(deferred) - 1; i >= 0; i-- {
		if lit, ok := ast.Unparen(deferred[i].Fun).(*ast.FuncLit); ok {
			ast.Inspect(lit.Body, calls)
		} else {
			w.call(info, deferred[i], f)
		}
	}
}

// skipped is whether c calls a function named in -skip.
func (w *walker) skipped(info *types.Info, c *ast.CallExpr) bool {
	fn := callee(info, c)
	return fn != nil && w.skip[name(fn)]
}

// callee is the function of the shim's packages or another that c calls
// by name, or nil (a call of a function value).
func callee(info *types.Info, c *ast.CallExpr) *types.Func {
	var id *ast.Ident
	switch fun := ast.Unparen(c.Fun).(type) {
	case *ast.Ident:
		id = fun
	case *ast.SelectorExpr:
		id = fun.Sel
	case *ast.IndexExpr: // a generic function
		if s, ok := fun.X.(*ast.SelectorExpr); ok {
			id = s.Sel
		} else if i, ok := fun.X.(*ast.Ident); ok {
			id = i
		}
	}
	if id == nil {
		return nil
	}
	fn, _ := info.Uses[id].(*types.Func)
	if fn == nil {
		return nil
	}
	return fn.Origin()
}

// call enters the callee of c if it is a function of the shim's packages
// not yet entered. Coming back to the caller's file is not a visit (a
// reader has read that far already), unless -unwind.
func (w *walker) call(info *types.Info, c *ast.CallExpr, from string) {
	fn := callee(info, c)
	if fn == nil {
		return
	}
	if _, ok := w.decls[fn]; !ok || w.seen[fn] || w.skip[name(fn)] {
		return
	}
	w.enter(fn, from)
	if w.unwind {
		w.visit(from)
	}
}

// failing is whether cond tests for an error: err != nil, retErr != nil,
// or either joined with && or ||.
func failing(cond ast.Expr) bool {
	b, ok := ast.Unparen(cond).(*ast.BinaryExpr)
	if !ok {
		return false
	}
	switch b.Op {
	case token.LAND, token.LOR:
		return failing(b.X) || failing(b.Y)
	case token.NEQ:
		id, ok := ast.Unparen(b.X).(*ast.Ident)
		nl, ok2 := ast.Unparen(b.Y).(*ast.Ident)
		return ok && ok2 && nl.Name == "nil" && (id.Name == "err" || id.Name == "retErr")
	}
	return false
}

// refuses is whether body ends by returning an error it makes there
// (fmt.Errorf, errors.New, &SomethingError{...}): a refusal of the request,
// as a failing error test's body is an error's path. Its message's helpers
// (the fork's name, a count in words) are not steps of the fork.
func refuses(body *ast.BlockStmt) bool {
	if len(body.List) == 0 {
		return false
	}
	ret, ok := body.List[len(body.List)-1].(*ast.ReturnStmt)
	if !ok || len(ret.Results) == 0 {
		return false
	}
	switch e := ast.Unparen(ret.Results[len(ret.Results)-1]).(type) {
	case *ast.CallExpr:
		s := types.ExprString(e.Fun)
		return s == "fmt.Errorf" || s == "errors.New"
	case *ast.UnaryExpr:
		lit, ok := e.X.(*ast.CompositeLit)
		return ok && e.Op == token.AND && strings.HasSuffix(types.ExprString(lit.Type), "Error")
	}
	return false
}

// accessor is whether fn is one statement that calls no function of the
// shim's packages: a getter or a flag test, not a step of the path. A
// getter under its lock (x.Lock(), defer x.Unlock(), one statement) is
// one too.
func (w *walker) accessor(fn *types.Func) bool {
	body := w.decls[fn].Body
	if len(body.List) == 3 && locks(body.List[0], body.List[1]) {
		body = &ast.BlockStmt{List: body.List[2:]}
	}
	if len(body.List) > 1 {
		return false
	}
	info, calls := w.infos[fn], false
	ast.Inspect(body, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok {
			var id *ast.Ident
			switch fun := ast.Unparen(c.Fun).(type) {
			case *ast.Ident:
				id = fun
			case *ast.SelectorExpr:
				id = fun.Sel
			}
			if id != nil {
				if f, ok := info.Uses[id].(*types.Func); ok && w.decls[f.Origin()] != nil {
					calls = true
				}
			}
		}
		return !calls
	})
	return !calls
}

// locks is whether a and b are x.Lock() and defer x.Unlock() (or RLock,
// RUnlock) on the same x.
func locks(a, b ast.Stmt) bool {
	es, ok := a.(*ast.ExprStmt)
	if !ok {
		return false
	}
	d, ok := b.(*ast.DeferStmt)
	if !ok {
		return false
	}
	lock, ok := es.X.(*ast.CallExpr)
	if !ok || len(lock.Args) > 0 {
		return false
	}
	ls, ok := lock.Fun.(*ast.SelectorExpr)
	us, ok2 := d.Call.Fun.(*ast.SelectorExpr)
	if !ok || !ok2 || len(d.Call.Args) > 0 {
		return false
	}
	pair := ls.Sel.Name + "/" + us.Sel.Name
	return (pair == "Lock/Unlock" || pair == "RLock/RUnlock") && types.ExprString(ls.X) == types.ExprString(us.X)
}
