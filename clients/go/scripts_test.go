package ratelimit

import (
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// The embedded copies in lua/ are lua-reference/'s files, byte for byte, and all of them:
// `go generate` (make test-go runs it) refreshes them.
func TestEmbeddedScriptsAreTheReference(t *testing.T) {
	reference, err := filepath.Glob("../../lua-reference/*.lua")
	if err != nil || len(reference) == 0 {
		t.Fatalf("lua-reference/ not found next to the package: %v", err)
	}
	entries, err := luaFiles.ReadDir("lua")
	if err != nil {
		t.Fatal(err)
	}
	var embedded, want []string
	for _, e := range entries {
		embedded = append(embedded, e.Name())
	}
	for _, path := range reference {
		name := filepath.Base(path)
		want = append(want, name)
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := lua(name); got != string(src) {
			t.Errorf("lua/%s differs from lua-reference/%s: run go generate", name, name)
		}
	}
	sort.Strings(embedded)
	sort.Strings(want)
	if len(embedded) != len(want) {
		t.Fatalf("embedded %v, lua-reference has %v", embedded, want)
	}
	for i := range want {
		if embedded[i] != want[i] {
			t.Fatalf("embedded %v, lua-reference has %v", embedded, want)
		}
	}
}
