package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
)

// Conn is how the package talks to Redis: one command, its name first, and its reply. The
// package passes every argument as a string and honours ctx itself (it sends each request from a
// goroutine of its own and stops waiting when ctx is done), but an implementation that gives ctx
// to its client also frees the connection then. A Conn that is also a DeadlineConn ends each
// command by its deadline itself, and the package sends on the caller's goroutine.
//
// A redigo pool (github.com/gomodule/redigo/redis) is one through the module
// redis-rate-limiter/ratelimit/redigoadapter (clients/go/redigoadapter, kept apart so that this
// package uses only the standard library): ratelimit.New(redigoadapter.New(pool), opts);
// and a go-redis client (github.com/redis/go-redis/v9: *redis.Client, *redis.ClusterClient or
// redis.UniversalClient) with:
//
//	type GoRedis struct{ redis.UniversalClient }
//
//	func (c GoRedis) Do(ctx context.Context, args ...interface{}) (interface{}, error) {
//		return c.UniversalClient.Do(ctx, args...).Result()
//	}
//
// Replies of both are normalised here (bulk strings as []byte or string, integers as int64 or
// int, arrays, nil; go-redis's redis.Nil is a nil reply), and so are their server errors
// (redigo's redis.Error, go-redis's RedisError: error types whose underlying type is a string),
// which the package tells apart from connection failures. An implementation of another client
// returns server error replies as a ServerError.
type Conn interface {
	Do(ctx context.Context, args ...interface{}) (interface{}, error)
}

// ServerError is an error reply of Redis (`ERR ...`, `WRONGTYPE ...`), as opposed to a failure
// to reach it. Connections of other clients than redigo and go-redis return their error replies
// as ServerError.
type ServerError string

func (e ServerError) Error() string { return string(e) }

// Code is the error's first word: ERR, WRONGTYPE, NOPERM, NOSCRIPT...
func (e ServerError) Code() string {
	s := string(e)
	if i := strings.IndexByte(s, ' '); i >= 0 {
		return s[:i]
	}
	return s
}

// serverMessage says whether err is an error reply of the server, and its message.
func serverMessage(err error) (string, bool) {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if se, ok := e.(ServerError); ok {
			return string(se), true
		}
		// redigo's redis.Error and go-redis's proto.RedisError are string types.
		if v := reflect.ValueOf(e); v.Kind() == reflect.String {
			return v.String(), true
		}
		if _, ok := e.(interface{ RedisError() }); ok {
			return e.Error(), true
		}
	}
	return "", false
}

// goRedisNil is go-redis's nil reply, which it returns as an error.
const goRedisNil = "redis: nil"

// DeadlineConn is a Conn that bounds each command by a deadline itself (redigoadapter.Pool is
// one: a redigo connection's read deadline). The package then sends on the caller's goroutine,
// with no goroutine, channel or timer of its own per request.
type DeadlineConn interface {
	Conn
	// DoBy is Do ending by deadline at the latest: the wait for a connection, its dial, the
	// command and its reply all end by then, a reply not read by then failing with an error
	// that is not a ServerError. A ctx already done sends nothing; its cancellation may end the
	// wait sooner, and need not.
	DoBy(ctx context.Context, deadline time.Time, args ...interface{}) (interface{}, error)
}

// do sends one command through conn and waits for its reply or for ctx, whichever comes
// first. A server error comes back as a ServerError; any other error means Redis did not
// answer. A caller whose ctx is already done sends nothing: the command would still run, and
// take from a limit, after its answer stopped mattering to anyone.
func do(ctx context.Context, conn Conn, args ...interface{}) (interface{}, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	type result struct {
		v   interface{}
		err error
	}
	ch := make(chan result, 1)
	tracker, _ := ctx.Value(trackerKey{}).(requestTracker)
	if tracker != nil {
		tracker.begin()
	}
	go func() {
		if tracker != nil {
			// Once conn.Do has returned, whether or not anyone still waits for it.
			defer tracker.end()
		}
		defer func() {
			if p := recover(); p != nil {
				ch <- result{nil, fmt.Errorf("ratelimit: the connection panicked: %v", p)}
			}
		}()
		v, err := conn.Do(ctx, args...)
		ch <- result{v, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		// A reply already there is taken, though this goroutine only looks now.
		select {
		case r = <-ch:
		default:
			return nil, ctx.Err()
		}
	}
	return reply(r.v, r.err)
}

// doBy sends one command through conn on the caller's goroutine, conn ending it by deadline.
// A ctx done by the time conn fails is the caller's giving up (ctx.Err()), as with do.
func doBy(ctx context.Context, conn DeadlineConn, deadline time.Time,
	args ...interface{}) (interface{}, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if tracker, _ := ctx.Value(trackerKey{}).(requestTracker); tracker != nil {
		tracker.begin()
		defer tracker.end()
	}
	v, err := callBy(ctx, conn, deadline, args)
	if err != nil {
		if _, server := serverMessage(err); !server {
			if cerr := ctx.Err(); cerr != nil {
				return nil, cerr
			}
		}
	}
	return reply(v, err)
}

// callBy is conn.DoBy, a panic in it an error.
func callBy(ctx context.Context, conn DeadlineConn, deadline time.Time,
	args []interface{}) (v interface{}, err error) {
	defer func() {
		if p := recover(); p != nil {
			v, err = nil, fmt.Errorf("ratelimit: the connection panicked: %v", p)
		}
	}()
	return conn.DoBy(ctx, deadline, args...)
}

// reply is a connection's answer normalised: a server error as a ServerError (go-redis's nil
// reply as nil), any other error as it is.
func reply(v interface{}, err error) (interface{}, error) {
	if err != nil {
		if msg, ok := serverMessage(err); ok {
			if msg == goRedisNil {
				return nil, nil
			}
			return nil, ServerError(msg)
		}
		return nil, err
	}
	return normalize(v), nil
}

// requestTracker hears of every request sent with a ctx that carries it (trackRequests): when
// one begins, and when the connection has returned from it, even after its caller stopped
// waiting (a lease's renewals, which its release waits for).
type requestTracker interface {
	begin()
	end()
}

type trackerKey struct{}

func trackRequests(ctx context.Context, t requestTracker) context.Context {
	return context.WithValue(ctx, trackerKey{}, t)
}

// normalize turns the replies of the common clients into int64, string, []interface{} and nil.
func normalize(v interface{}) interface{} {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case int:
		return int64(x)
	case int32:
		return int64(x)
	case []interface{}:
		// As it is when every element is already normal (a limiter's integers): no copy.
		i := 0
		for ; i < len(x) && isNormal(x[i]); i++ {
		}
		if i == len(x) {
			return x
		}
		out := make([]interface{}, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	case []string:
		out := make([]interface{}, len(x))
		for i, e := range x {
			out[i] = e
		}
		return out
	case []int64:
		out := make([]interface{}, len(x))
		for i, e := range x {
			out[i] = e
		}
		return out
	}
	return v
}

// isNormal says whether normalize leaves v as it is (and what it holds).
func isNormal(v interface{}) bool {
	switch v.(type) {
	case int64, string, nil:
		return true
	}
	return false
}

// errUnexpected is a reply of the wrong shape: Redis is not answering as the module would.
type errUnexpected struct{ reply interface{} }

func (e errUnexpected) Error() string { return fmt.Sprintf("unexpected reply: %#v", e.reply) }

func asInt(v interface{}) (int64, bool) {
	i, ok := v.(int64)
	return i, ok
}

func asText(v interface{}) (string, bool) {
	s, ok := v.(string)
	return s, ok
}

// decisionOf reads a five-integer reply.
func decisionOf(v interface{}) (Decision, bool) {
	d, _, ok := decisionOfN(v, 5)
	return d, ok
}

// decisionOfN reads a reply of fields integers: the five of a decision, and for a partial grant
// a sixth, the units granted (returned, else 0).
func decisionOfN(v interface{}, fields int) (Decision, int64, bool) {
	items, ok := v.([]interface{})
	if !ok || len(items) != fields {
		return Decision{}, 0, false
	}
	var f [6]int64
	for i, it := range items {
		n, ok := asInt(it)
		if !ok {
			return Decision{}, 0, false
		}
		f[i] = n
	}
	if f[1] < 0 || f[3] < 0 || f[4] < 0 || f[5] < 0 {
		return Decision{}, 0, false
	}
	return Decision{Allowed: f[0] == 1, Remaining: f[1], RetryAfterMs: f[2], ResetAfterMs: f[3],
		Limit: f[4]}, f[5], true
}

// decisionsOf reads n five-integer replies.
func decisionsOf(v interface{}, n int) ([]Decision, bool) {
	items, ok := v.([]interface{})
	if !ok || len(items) != n {
		return nil, false
	}
	out := make([]Decision, n)
	for i, it := range items {
		d, ok := decisionOf(it)
		if !ok {
			return nil, false
		}
		out[i] = d
	}
	return out, true
}

// multiOf reads RL.ALL's reply for n limits: [allowed, denied_by, reply...].
func multiOf(v interface{}, n int) (bool, int, []Decision, bool) {
	allowed, deniedBy, ds, _, ok := multiOfN(v, n, 5)
	return allowed, deniedBy, ds, ok
}

// multiOfN is multiOf with replies of fields integers each; for a partial grant (6) the units
// granted, the same in every reply (the first's returned).
func multiOfN(v interface{}, n, fields int) (bool, int, []Decision, int64, bool) {
	items, ok := v.([]interface{})
	if !ok || len(items) != n+2 {
		return false, 0, nil, 0, false
	}
	allowed, ok1 := asInt(items[0])
	deniedBy, ok2 := asInt(items[1])
	if !ok1 || !ok2 || deniedBy < 0 {
		return false, 0, nil, 0, false
	}
	ds := make([]Decision, n)
	var granted int64
	for i, it := range items[2:] {
		d, g, ok := decisionOfN(it, fields)
		if !ok {
			return false, 0, nil, 0, false
		}
		if i == 0 {
			granted = g
		}
		ds[i] = d
	}
	return allowed == 1, int(deniedBy), ds, granted, true
}

func topEntriesOf(v interface{}) ([]TopEntry, bool) {
	items, ok := v.([]interface{})
	if !ok {
		return nil, false
	}
	out := make([]TopEntry, 0, len(items))
	for _, it := range items {
		f, ok := it.([]interface{})
		if !ok || len(f) != 6 {
			return nil, false
		}
		key, ok1 := asText(f[0])
		denied, ok2 := asInt(f[1])
		errBound, ok3 := asInt(f[2])
		command, ok4 := asText(f[3])
		first, ok5 := asInt(f[4])
		last, ok6 := asInt(f[5])
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || denied < 0 || errBound < 0 {
			return nil, false
		}
		out = append(out, TopEntry{Key: strings.ToValidUTF8(key, "\uFFFD"), Denied: denied,
			Error: errBound, Command: command, FirstDeniedMs: first, LastDeniedMs: last})
	}
	return out, true
}
