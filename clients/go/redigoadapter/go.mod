module redis-rate-limiter/ratelimit/redigoadapter

go 1.19

require github.com/gomodule/redigo v1.8.3

// Built here offline from Debian's golang-github-gomodule-redigo-dev (make test-go). A replace
// applies only in the main module: an application's go.mod names its own redigo.
replace github.com/gomodule/redigo => /usr/share/gocode/src/github.com/gomodule/redigo
