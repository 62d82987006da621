// Package redigoadapter makes a redigo pool (github.com/gomodule/redigo/redis) a ratelimit.Conn:
//
//	pool := &redis.Pool{MaxIdle: 64, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
//	client := ratelimit.New(redigoadapter.New(pool), ratelimit.Options{})
//
// NewSentinel follows the master a set of Sentinels name, and NewCluster a Redis Cluster on
// redisc (github.com/mna/redisc, redigo's cluster client), across failovers.
//
// It is a module of its own (redis-rate-limiter/ratelimit/redigoadapter), so that the package
// ratelimit keeps to the standard library and only the applications that use redigo build it.
// It works with redigo 1.8.3 (Debian's) and later, and redisc 1.1.7. Each call takes a
// connection of the pool for one command and gives it back.
//
// The call's context, as far as redigo 1.8.3 allows: waiting for a connection of the pool and
// dialing one end with the context (Pool.GetContext); the reply is waited for until the
// context's deadline (redis.DoWithTimeout), and a context without a deadline waits for it as
// long as the connection's read timeout (redis.DialReadTimeout, none by default). A context
// already done sends nothing. Writing the command is bounded by redis.DialWriteTimeout only,
// and cancelling a context without a deadline does not interrupt the read: redigo 1.8.3 has no
// way to. The package ratelimit stops waiting at its own deadline whatever the adapter does. A
// connection whose read timed out is closed by redigo, not given back to the pool.
package redigoadapter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Pool is a redigo pool as a ratelimit.Conn. Safe for concurrent use, as the pool is; give it
// at least as many idle connections (MaxIdle) as the client's Options.MaxInFlight (64 by
// default), or a burst dials and closes connections.
type Pool struct{ *redis.Pool }

// New is Pool{p}.
func New(p *redis.Pool) Pool { return Pool{p} }

// ErrNoCommand is the error of a call without a command name.
var ErrNoCommand = errors.New("redigoadapter: no command")

// Do sends one command (args[0], a string, and its arguments) on a connection of the pool and
// returns redigo's reply: error replies as redis.Error, which the package ratelimit tells from
// a failure to reach Redis.
func (p Pool) Do(ctx context.Context, args ...interface{}) (interface{}, error) {
	if len(args) == 0 {
		return nil, ErrNoCommand
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := p.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return doOn(ctx, c, args...)
}

// Pin lends one connection of the pool for several commands in a row (ratelimit.Pinner: a
// durable admission's call, then its WAIT on the same connection): do sends a command on it,
// release gives it back to the pool.
func (p Pool) Pin(ctx context.Context) (func(ctx context.Context, args ...interface{}) (interface{},
	error), func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	c, err := p.GetContext(ctx)
	if err != nil {
		return nil, nil, err
	}
	// The package ratelimit stops waiting at its deadline, maybe before the reply is read: the
	// connection goes back once no command is on it (each read ends by its deadline).
	var busy sync.WaitGroup
	do := func(ctx context.Context, args ...interface{}) (interface{}, error) {
		busy.Add(1)
		defer busy.Done()
		return doOn(ctx, c, args...)
	}
	release := func() {
		go func() {
			busy.Wait()
			c.Close()
		}()
	}
	return do, release, nil
}

// doOn sends one command on c within ctx's deadline.
func doOn(ctx context.Context, c redis.Conn, args ...interface{}) (interface{}, error) {
	if len(args) == 0 {
		return nil, ErrNoCommand
	}
	name, ok := args[0].(string)
	if !ok || name == "" {
		return nil, fmt.Errorf("redigoadapter: the command name is %T, not a string", args[0])
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d, ok := ctx.Deadline()
	if !ok {
		// The connection's own read timeout. (DoWithTimeout with 0 would wait with none.)
		return c.Do(name, args[1:]...)
	}
	// A deadline that passed while the connection was taken: nothing sent.
	timeout := time.Until(d)
	if timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	return redis.DoWithTimeout(c, timeout, name, args[1:]...)
}
