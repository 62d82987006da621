package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The Go packages' table of docs/architecture.md ("The Go client's packages"), checked against
// what go list says each package of the three modules imports.

const goPackage = "redis-rate-limiter/ratelimit"

// goTable is the table after <!-- layers: go -->: each package and what it may import besides
// the standard library.
func goTable(t *testing.T) map[string][]string {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	const marker = "<!-- layers: go -->"
	i := bytes.Index(b, []byte(marker))
	if i < 0 {
		t.Fatalf("docs/architecture.md has no %q", marker)
	}
	quoted := regexp.MustCompile("`([^`]+)`")
	table := map[string][]string{}
	for _, line := range strings.Split(string(b[i+len(marker):]), "\n")[1:] {
		if strings.TrimSpace(line) == "" {
			break
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		pkg := quoted.FindStringSubmatch(cells[1])
		if pkg == nil {
			continue // the header and its rule
		}
		uses := []string{}
		for _, m := range quoted.FindAllStringSubmatch(cells[2], -1) {
			uses = append(uses, m[1])
		}
		table[pkg[1]] = uses
	}
	if len(table) == 0 {
		t.Fatalf("the table after %q is empty", marker)
	}
	return table
}

// listedPackage is what go list -json says of a package.
type listedPackage struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// goList runs go list offline in dir and decodes its stream of JSON objects.
func goList(t *testing.T, dir string, args ...string) []byte {
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off", "GOSUMDB=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	return out
}

// importViolations are what breaks the table: a package it does not list, an import (test files'
// included) that is neither the standard library, the package itself nor in its row, and rows
// that let packages import each other around a circle.
func importViolations(table map[string][]string, listed []listedPackage, std map[string]bool) []string {
	var wrong []string
	for _, p := range listed {
		allowed, ok := table[p.ImportPath]
		if !ok {
			wrong = append(wrong, fmt.Sprintf("%s is not in docs/architecture.md", p.ImportPath))
			continue
		}
		may := map[string]bool{p.ImportPath: true}
		for _, a := range allowed {
			may[a] = true
		}
		seen := map[string]bool{}
		for _, imports := range [][]string{p.Imports, p.TestImports, p.XTestImports} {
			for _, im := range imports {
				if std[im] || may[im] || seen[im] {
					continue
				}
				seen[im] = true
				wrong = append(wrong, fmt.Sprintf("%s imports %s", p.ImportPath, im))
			}
		}
	}
	// A circle among the rows: a depth-first walk that comes back to a package on its path.
	state := map[string]int{} // 1: on the path, 2: done
	var path []string
	var walk func(string)
	walk = func(p string) {
		state[p] = 1
		path = append(path, p)
		for _, q := range table[p] {
			if _, ours := table[q]; !ours {
				continue
			}
			switch state[q] {
			case 0:
				walk(q)
			case 1:
				k := len(path) - 1
				for path[k] != q {
					k--
				}
				wrong = append(wrong, "a circle: "+strings.Join(append(append([]string{}, path[k:]...), q), " -> "))
			}
		}
		path = path[:len(path)-1]
		state[p] = 2
	}
	names := make([]string, 0, len(table))
	for p := range table {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		if state[p] == 0 {
			walk(p)
		}
	}
	return wrong
}

func TestGoPackagesImportOnlyDownward(t *testing.T) {
	table := goTable(t)
	// What the table must say whatever else changes: the package keeps to the standard library,
	// and the adapter to the package, redigo and redisc (redigo's cluster client).
	if uses := table[goPackage]; uses == nil || len(uses) != 0 {
		t.Fatalf("the table lets %s import %v (it must import only the standard library)", goPackage, uses)
	}
	adapter := goPackage + "/redigoadapter"
	for _, u := range table[adapter] {
		if u != goPackage && u != "github.com/gomodule/redigo/redis" && u != "github.com/mna/redisc" {
			t.Fatalf("the table lets %s import %s", adapter, u)
		}
	}
	std := map[string]bool{}
	for _, p := range strings.Fields(string(goList(t, ".", "std"))) {
		std[p] = true
	}
	if !std["net/http"] || std[goPackage] {
		t.Fatalf("go list std: %d packages", len(std))
	}
	var listed []listedPackage
	found := map[string]bool{}
	for _, dir := range []string{"..", filepath.Join("..", "redigoadapter"), "."} {
		dec := json.NewDecoder(bytes.NewReader(goList(t, dir, "-json", "./...")))
		for {
			var p listedPackage
			if err := dec.Decode(&p); err == io.EOF {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			listed = append(listed, p)
			found[p.ImportPath] = true
		}
	}
	for p := range table {
		if !found[p] {
			t.Errorf("docs/architecture.md lists %s, which go list does not find", p)
		}
	}
	if wrong := importViolations(table, listed, std); len(wrong) > 0 {
		t.Fatalf("the Go packages against docs/architecture.md:\n%s", strings.Join(wrong, "\n"))
	}
	for _, p := range listed {
		t.Logf("%s: %d imports, %d of its tests", p.ImportPath, len(p.Imports),
			len(p.TestImports)+len(p.XTestImports))
	}
}

// The checker itself: a package missing from the table, a forbidden import in a test file, and
// a circle of rows.
func TestGoPackagesCheckerSeesWhatBreaksTheTable(t *testing.T) {
	table := map[string][]string{"a": {}, "b": {"a", "c"}, "c": {"b"}}
	listed := []listedPackage{
		{ImportPath: "a", Imports: []string{"fmt"}, XTestImports: []string{"a", "b"}},
		{ImportPath: "b", Imports: []string{"a", "c", "fmt"}},
		{ImportPath: "d"},
	}
	got := importViolations(table, listed, map[string]bool{"fmt": true})
	want := []string{"a imports b", "d is not in docs/architecture.md", "a circle: b -> c -> b"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got := importViolations(map[string][]string{"a": {}, "b": {"a"}},
		[]listedPackage{{ImportPath: "b", Imports: []string{"a"}}}, nil); len(got) != 0 {
		t.Fatalf("%q", got)
	}
}
