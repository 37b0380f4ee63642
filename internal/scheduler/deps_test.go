package scheduler

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPureCore guards the package's purity: no I/O packages, no wall clock,
// no global randomness, in every non-test source file.
func TestPureCore(t *testing.T) {
	t.Parallel()
	forbidden := []string{
		"os", "os/exec", "net", "net/http", "io/ioutil", "database/sql", "syscall", "unsafe",
		"math/rand", "math/rand/v2", "crypto/rand", "log", "log/slog", "context",
	}
	forbiddenPrefixes := []string{"github.com/jackc/", "github.com/riverqueue/", "github.com/labstack/", "net/"}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			for _, bad := range forbidden {
				if path == bad {
					t.Errorf("%s imports %s", name, path)
				}
			}
			for _, bad := range forbiddenPrefixes {
				if strings.HasPrefix(path, bad) {
					t.Errorf("%s imports %s", name, path)
				}
			}
		}
		full, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(full, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "time" {
				switch sel.Sel.Name {
				case "Now", "Since", "Until", "Sleep", "After", "Tick", "NewTimer", "NewTicker", "AfterFunc":
					t.Errorf("%s: time.%s reads or waits on the wall clock", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}

// TestPackageDoc keeps the package documented in one place.
func TestPackageDoc(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "types.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	if f.Doc == nil || !strings.HasPrefix(f.Doc.Text(), "Package scheduler ") {
		t.Errorf("types.go lacks the package doc")
	}
}
