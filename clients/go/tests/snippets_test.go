package tests

import (
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Every ```go block of README.md and docs/go.md, extracted from the Markdown, is a program of
// its own in a temporary module that uses the package: go vet and go build (offline, as make
// test-go builds), then run against a server with the module that the test starts. A block of
// statements runs with ctx, addr, pool, client, app, planOf and classOf defined as an
// application would have them, and must send the server at least one command of the module; a
// block of declarations (an adapter) must make a ratelimit.Conn. What a block registers with
// http.Handle or gives to http.ListenAndServe answers one request (net/http is the package
// "snippets/http", net/http's own names but ListenAndServe, which keeps the handler instead of
// binding a port); a block that makes a redigoadapter.Cluster runs against a cluster of one
// node, addr its address. go-redis is not among the packages the tests build with: its adapter block
// is compiled against the two signatures it uses (Do, Result, as in github.com/redis/go-redis/v9)
// and not run.

type snippet struct {
	file string
	line int
	code string
}

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

func goSnippets(t *testing.T) []snippet {
	var out []snippet
	for _, f := range []string{"README.md", "docs/go.md"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "..", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range goBlock.FindAllSubmatchIndex(b, -1) {
			out = append(out, snippet{f, 1 + bytes.Count(b[:m[0]], []byte("\n")), string(b[m[2]:m[3]])})
		}
	}
	return out
}

var snippetImports = []struct{ ident, path string }{
	{"context.", "context"}, {"errors.", "errors"}, {"fmt.", "fmt"}, {"time.", "time"},
	{"http.", "snippets/http"}, {"redisc.", "github.com/mna/redisc"},
	{"ratelimit.", "redis-rate-limiter/ratelimit"},
	{"redigoadapter.", "redis-rate-limiter/ratelimit/redigoadapter"},
}

const snippetPrelude = `package main

import (
	"context"
	"fmt"
	nethttp "net/http"
	"net/http/httptest"
	"os"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
	"redis-rate-limiter/ratelimit/redigoadapter"
	shim "snippets/http"
)

var (
	ctx    = context.Background()
	addr   = os.Getenv("RL_SNIPPET_ADDR")
	pool   = &redis.Pool{MaxIdle: 64, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	client = ratelimit.New(redigoadapter.New(pool), ratelimit.Options{})
	app    = nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) { fmt.Fprint(w, "ok") })
)

func planOf(r *nethttp.Request) string  { return r.Header.Get("X-Plan") }
func classOf(r *nethttp.Request) string { return "api" }

func main() {
	snippet()
	h := shim.Served
	if h == nil {
		h = nethttp.DefaultServeMux
	}
	if _, pattern := nethttp.DefaultServeMux.Handler(httptest.NewRequest("GET", "/", nil)); pattern == "" && shim.Served == nil {
		return
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Api-Key", "k1")
	r.Header.Set("X-Plan", "pro")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Printf("GET / %d RateLimit: %s\n", w.Code, w.Header().Get("RateLimit"))
}
`

const snippetHTTP = `// Package http is net/http for the snippets, but ListenAndServe keeps the handler.
package http

import nethttp "net/http"

type (
	Handler        = nethttp.Handler
	HandlerFunc    = nethttp.HandlerFunc
	Request        = nethttp.Request
	ResponseWriter = nethttp.ResponseWriter
)

var Served Handler

func Handle(pattern string, h Handler) { nethttp.Handle(pattern, h) }

func HandleFunc(pattern string, f func(ResponseWriter, *Request)) { nethttp.HandleFunc(pattern, f) }

func ListenAndServe(addr string, h Handler) error {
	Served = h
	return nil
}
`

const snippetGoRedis = `// Package redis has the two signatures of github.com/redis/go-redis/v9 its adapter uses.
package redis

import "context"

type Cmd struct {
	val interface{}
	err error
}

func (c *Cmd) Result() (interface{}, error) { return c.val, c.err }

type UniversalClient interface {
	Do(ctx context.Context, args ...interface{}) *Cmd
}
`

// snippetProgram is the file of a block: its declarations, or its statements in func snippet
// with every variable they declare used once.
func snippetProgram(code string) (string, bool, error) {
	var imports []string
	for _, im := range snippetImports {
		if strings.Contains(code, im.ident) {
			imports = append(imports, fmt.Sprintf("%q", im.path))
		}
	}
	if strings.Contains(code, "redis.UniversalClient") {
		imports = append(imports, `"github.com/redis/go-redis/v9"`)
	} else if strings.Contains(code, "redis.") {
		imports = append(imports, `"github.com/gomodule/redigo/redis"`)
	}
	head := "package main\n\nimport (\n\t" + strings.Join(imports, "\n\t") + "\n)\n\n"
	decls := strings.HasPrefix(code, "type ") || strings.HasPrefix(code, "func ")
	if decls {
		var conns []string
		for _, m := range regexp.MustCompile(`(?m)^type (\w+) struct`).FindAllStringSubmatch(code, -1) {
			conns = append(conns, "\tvar _ ratelimit.Conn = "+m[1]+"{}\n")
		}
		if !strings.Contains(code, "ratelimit.") {
			head = strings.Replace(head, "import (\n", "import (\n\t\"redis-rate-limiter/ratelimit\"\n", 1)
		}
		return head + code + "\nfunc snippet() {\n" + strings.Join(conns, "") + "}\n", true, nil
	}
	body := "func snippet() {\n" + code + "}\n"
	f, err := parser.ParseFile(token.NewFileSet(), "snippet.go", head+body, 0)
	if err != nil {
		return "", false, err
	}
	var used []string
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		for _, st := range fn.Body.List {
			switch st := st.(type) {
			case *ast.AssignStmt:
				if st.Tok == token.DEFINE {
					for _, e := range st.Lhs {
						if id, ok := e.(*ast.Ident); ok && id.Name != "_" {
							used = append(used, "\t_ = "+id.Name+"\n")
						}
					}
				}
			case *ast.DeclStmt:
				if g, ok := st.Decl.(*ast.GenDecl); ok {
					for _, sp := range g.Specs {
						if v, ok := sp.(*ast.ValueSpec); ok {
							for _, id := range v.Names {
								used = append(used, "\t_ = "+id.Name+"\n")
							}
						}
					}
				}
			}
		}
	}
	return head + "func snippet() {\n" + code + strings.Join(used, "") + "}\n", false, nil
}

func TestEveryGoSnippetOfTheDocsCompilesAndRuns(t *testing.T) {
	if os.Getenv("RL_SNIPPETS") == "0" {
		t.Skip("RL_SNIPPETS=0: the snippets are run once, on one server (make test-go)")
	}
	snippets := goSnippets(t)
	if len(snippets) < 8 {
		t.Fatalf("only %d Go blocks found in README.md and docs/go.md", len(snippets))
	}
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	root := t.TempDir()
	write := func(p, s string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", fmt.Sprintf(`module snippets

go 1.19

require (
	github.com/gomodule/redigo v1.8.3
	github.com/mna/redisc v1.1.7
	github.com/redis/go-redis/v9 v9.0.0
	redis-rate-limiter/ratelimit v0.0.0
	redis-rate-limiter/ratelimit/redigoadapter v0.0.0
)

replace (
	github.com/gomodule/redigo => /usr/share/gocode/src/github.com/gomodule/redigo
	github.com/mna/redisc => %s
	github.com/redis/go-redis/v9 => ./goredis
	redis-rate-limiter/ratelimit => %s
	redis-rate-limiter/ratelimit/redigoadapter => %s
)
`, abs(".deps/redisc"), abs(".."), abs("../redigoadapter")))
	write("goredis/go.mod", "module github.com/redis/go-redis/v9\n\ngo 1.19\n")
	write("goredis/redis.go", snippetGoRedis)
	write("http/http.go", snippetHTTP)
	decls := map[string]bool{}
	for i, s := range snippets {
		prog, isDecls, err := snippetProgram(s.code)
		if err != nil {
			t.Fatalf("%s:%d: %v\n%s", s.file, s.line, err, s.code)
		}
		dir := fmt.Sprintf("s%02d", i)
		decls[dir] = isDecls
		write(filepath.Join(dir, "prelude.go"), snippetPrelude)
		write(filepath.Join(dir, "snippet.go"), fmt.Sprintf("// %s:%d\n\n%s", s.file, s.line, prog))
	}
	gocmd := func(args ...string) {
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOSUMDB=off", "GOFLAGS=-mod=readonly")
		if out, err := cmd.CombinedOutput(); err != nil {
			var where []string
			for i, sn := range snippets {
				where = append(where, fmt.Sprintf("s%02d: %s:%d", i, sn.file, sn.line))
			}
			t.Fatalf("go %s: %v\n%s(%s)", strings.Join(args, " "), err, out, strings.Join(where, ", "))
		}
	}
	gocmd("vet", "./...")
	gocmd("build", "-o", filepath.Join(root, "bin")+"/", "./...")

	s := start(t, serverOpts{module: true})
	a := admin(t, s)
	// A block that makes a redigoadapter.Cluster runs against a cluster of one node (every slot
	// its own), started for the first such block.
	var node *server
	var nodeConn redis.Conn
	for i, sn := range snippets {
		dir := fmt.Sprintf("s%02d", i)
		s, a := s, a
		if strings.Contains(sn.code, "redigoadapter.NewCluster(") {
			if node == nil {
				node = start(t, serverOpts{module: true, cluster: true})
				nodeConn = admin(t, node)
				must(t, nodeConn, "CLUSTER", "ADDSLOTSRANGE", 0, 16383)
				waitFor(t, "a cluster of one node", func() bool {
					return strings.Contains(clusterInfo(node, "INFO"), "cluster_state:ok")
				})
			}
			s, a = node, nodeConn
		}
		must(t, a, "FLUSHALL")
		must(t, a, "CONFIG", "RESETSTAT")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, filepath.Join(root, "bin", dir))
		cmd.Env = append(os.Environ(), "RL_SNIPPET_ADDR="+s.addr())
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("%s:%d: %v\n%s", sn.file, sn.line, err, out)
		}
		info, err := redis.String(a.Do("INFO", "commandstats"))
		if err != nil {
			t.Fatal(err)
		}
		sent := strings.Count(info, "cmdstat_rl.")
		if decls[dir] {
			t.Logf("%s:%d: declarations, compiled; output %q", sn.file, sn.line, out)
			continue
		}
		if sent == 0 {
			t.Fatalf("%s:%d ran without sending the server a command of the module (output %q)",
				sn.file, sn.line, out)
		}
		if strings.HasPrefix(string(out), "GET / ") && !strings.HasPrefix(string(out), "GET / 200 ") {
			t.Fatalf("%s:%d: %s", sn.file, sn.line, out)
		}
		t.Logf("%s:%d: ran, %d of the module's commands used; output %q", sn.file, sn.line, sent, out)
	}
}
