module redis-rate-limiter/ratelimit/tests

go 1.19

require (
	github.com/gomodule/redigo v1.8.3
	github.com/mna/redisc v1.1.7
	redis-rate-limiter/ratelimit v0.0.0
	redis-rate-limiter/ratelimit/redigoadapter v0.0.0
)

// Offline, from Debian's packages (golang-github-gomodule-redigo-dev,
// golang-github-mna-redisc-dev): redisc's sources have no go.mod, so make test-go copies them
// into .deps/redisc with one.
replace (
	github.com/gomodule/redigo => /usr/share/gocode/src/github.com/gomodule/redigo
	github.com/mna/redisc => ./.deps/redisc
	redis-rate-limiter/ratelimit => ../
	redis-rate-limiter/ratelimit/redigoadapter => ../redigoadapter
)
