module redis-rate-limiter/ratelimit/redigoadapter

go 1.19

require (
	github.com/gomodule/redigo v1.8.3
	github.com/mna/redisc v1.1.7
)

// Built here offline from Debian's golang-github-gomodule-redigo-dev and
// golang-github-mna-redisc-dev (make test-go; redisc's sources have no go.mod, so make go-deps
// copies them into clients/go/tests/.deps/redisc with one). A replace applies only in the main
// module: an application's go.mod names its own redigo and redisc.
replace (
	github.com/gomodule/redigo => /usr/share/gocode/src/github.com/gomodule/redigo
	github.com/mna/redisc => ../tests/.deps/redisc
)
