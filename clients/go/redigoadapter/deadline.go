package redigoadapter

import (
	"context"
	"fmt"
	"time"

	"github.com/gomodule/redigo/redis"
)

// DoBy is Do ending by deadline (ratelimit.DeadlineConn, which the package ratelimit sends
// through on the caller's goroutine, with no goroutine or timer per command): an idle
// connection of the pool is taken and the reply awaited until deadline (the connection's read
// deadline, redis.DoWithTimeout). When the pool has no idle connection (a dial is ahead) or
// makes callers wait for one (Wait with MaxActive), the command goes from a goroutine instead,
// the caller waiting for it until deadline or ctx's end. Two calls racing for the pool's last
// idle connection may have the loser dial on its own goroutine, bounded by the pool's dial
// (redis.DialConnectTimeout). A ctx already done sends nothing; a cancellation later does not
// interrupt the read, which ends by deadline.
func (p Pool) DoBy(ctx context.Context, deadline time.Time, args ...interface{}) (interface{},
	error) {
	if len(args) == 0 {
		return nil, ErrNoCommand
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if (p.Pool.MaxActive > 0 && p.Pool.Wait) || p.Pool.IdleCount() == 0 {
		return p.doWatched(ctx, deadline, args)
	}
	c := p.Pool.Get()
	defer c.Close()
	return doBefore(c, deadline, args)
}

// doBefore sends one command on c, its reply awaited until deadline.
func doBefore(c redis.Conn, deadline time.Time, args []interface{}) (interface{}, error) {
	name, ok := args[0].(string)
	if !ok || name == "" {
		// (doOn's error.)
		return doOn(context.Background(), c, args...)
	}
	// A deadline that passed while the connection was taken: nothing sent.
	timeout := time.Until(deadline)
	if timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	return redis.DoWithTimeout(c, timeout, name, args[1:]...)
}

// doWatched is Do within deadline from a goroutine, which the caller stops waiting for at
// deadline (or when ctx ends): a wait for the pool or a dial that outlasts it goes on alone.
func (p Pool) doWatched(ctx context.Context, deadline time.Time, args []interface{}) (interface{},
	error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	type result struct {
		v   interface{}
		err error
	}
	ch := make(chan result, 1)
	go func() {
		defer func() {
			if e := recover(); e != nil {
				ch <- result{nil, fmt.Errorf("redigoadapter: %v", e)}
			}
		}()
		v, err := p.Do(ctx, args...)
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		select {
		case r := <-ch:
			return r.v, r.err
		default:
			return nil, ctx.Err()
		}
	}
}
