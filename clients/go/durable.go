package ratelimit

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"
)

// Durable admissions: each admitting write is acknowledged by replicas (WAIT n timeout after the
// call, on the connection the call went on) before it admits. WAIT waits for the writes of the
// connection it is sent on and holds that connection until the replicas answer, so every
// durable call takes a connection of its own from the Conn (a Pinner) and gives it back when
// done.

// Pinner is a Conn that can lend one of its connections for several commands in a row, as
// durable admissions need (the call, then WAIT on the same connection): do sends a command on
// that connection, release gives it back. redigoadapter.Pool is one. The types are the standard
// library's only, so that an adapter implements it without importing this package.
type Pinner interface {
	Pin(ctx context.Context) (do func(ctx context.Context, args ...interface{}) (interface{},
		error), release func(), err error)
}

// ShortAck is what a durable client does with an admission fewer replicas acknowledged than it
// asked.
type ShortAck int

const (
	// ShortAckDeny denies it (the units stay spent on the master: under-admission, never over).
	ShortAckDeny ShortAck = iota
	// ShortAckAdmit admits it, and counts it in DurabilityStats.Short.
	ShortAckAdmit
	// ShortAckFailurePolicy answers it with the failure policy, as if Redis had not answered.
	ShortAckFailurePolicy
)

// Durability is a durable client's admissions (Client.WithDurability): each admitting write is
// acknowledged by Replicas replicas before it admits.
type Durability struct {
	// Replicas that must acknowledge the write (at least 1).
	Replicas int
	// How long WAIT waits for them (below the client's own Timeout, which bounds the call and
	// the WAIT together).
	Timeout time.Duration
	// What an admission that fewer replicas acknowledged becomes (default ShortAckDeny).
	Short ShortAck
	// AOF: the replicas must have the write in their append-only file too (WAITAOF 0 replicas
	// timeout: fsynced, so a replica that restarts keeps it), not only in memory. Replicas
	// without appendonly yes never acknowledge it. A server without WAITAOF (before Redis 7.2)
	// gets WAIT.
	AOF bool
}

// DurabilityStats is what a durable client's admissions met so far.
type DurabilityStats struct {
	// Admissions acknowledged by enough replicas.
	Acknowledged uint64
	// Admissions fewer replicas acknowledged in time (then answered as Durability.Short says).
	Short uint64
}

type lane struct {
	pinner     Pinner
	durability Durability
	acks       atomic.Uint64
	short      atomic.Uint64
	// Set when the server answered that it has no WAITAOF: WAIT from then on.
	noWaitaof atomic.Bool
}

// connFunc is a function as a Conn.
type connFunc func(ctx context.Context, args ...interface{}) (interface{}, error)

func (f connFunc) Do(ctx context.Context, args ...interface{}) (interface{}, error) {
	return f(ctx, args...)
}

// pinnedKey carries, in a call's context, the connection its requests go on.
type pinnedKey struct{}

// WithDurability is a client sharing c's connection, mode, breaker, batches and deny cache
// whose calls that may write (a cost above 0, a partial grant, a lease; RL.ALL too) run on a
// connection of their own, followed by WAIT replicas timeout on that same connection (WAITAOF
// 0 replicas timeout with AOF, WAIT on a server without it). An admission acknowledged by fewer
// replicas in time becomes what d.Short says. Denials write nothing worth waiting for and are
// answered at once. An *UnsupportedError when the Conn is not a Pinner, d.Replicas is below 1,
// or d.Timeout is not below the client's Timeout.
func (c *Client) WithDurability(d Durability) (*Client, error) {
	p, ok := c.conn.(Pinner)
	if !ok {
		return nil, unsupported("durable admissions need a Conn that lends a connection (Pinner)")
	}
	if d.Replicas < 1 {
		return nil, unsupported("durable admissions need at least 1 replica")
	}
	if d.Timeout >= c.opts.Timeout {
		return nil, unsupported("the WAIT timeout must be below the client's timeout")
	}
	cp := *c
	cp.durable = &lane{pinner: p, durability: d}
	return &cp, nil
}

// DurabilityStats is what the durable admissions met so far (all zero without durability).
func (c *Client) DurabilityStats() DurabilityStats {
	if c.durable == nil {
		return DurabilityStats{}
	}
	return DurabilityStats{Acknowledged: c.durable.acks.Load(),
		Short: c.durable.short.Load()}
}

// laneFor is the durable lane, for a call that may write (a cost above 0, a partial grant, a
// lease).
func (c *Client) laneFor(t take, lease string) *lane {
	if c.durable == nil || (t.n == 0 && !t.upto && lease == "") {
		return nil
	}
	return c.durable
}

// errShortAck: fewer replicas acknowledged the write than asked, answered by the failure policy.
var errShortAck = errors.New("fewer replicas acknowledged the write than asked")

// durably runs call on a connection of the lane, then, when it admitted, asks the replicas:
// whether the admission stands (false: deny it), or errShortAck.
func (c *Client) durably(ctx context.Context, l *lane, call func(context.Context) (bool, error)) (bool,
	error) {
	// The call and its WAIT within one timeout.
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	do, release, err := l.pinner.Pin(ctx)
	if err != nil {
		return false, err
	}
	defer release()
	pinned := connFunc(do)
	ctx = context.WithValue(ctx, pinnedKey{}, Conn(pinned))
	admitted, err := call(ctx)
	if err != nil || !admitted {
		return true, err
	}
	enough, err := l.acknowledged(ctx, pinned)
	if err != nil {
		return false, err
	}
	if enough {
		return true, nil
	}
	switch l.durability.Short {
	case ShortAckAdmit:
		return true, nil
	case ShortAckFailurePolicy:
		return false, errShortAck
	}
	return false, nil
}

// acknowledged sends WAIT replicas timeout (or WAITAOF 0 replicas timeout) on conn after its
// write: whether enough replicas acknowledged it (counted either way).
func (l *lane) acknowledged(ctx context.Context, conn Conn) (bool, error) {
	aof := l.durability.AOF && !l.noWaitaof.Load()
	acks, err := l.wait(ctx, conn, aof)
	var se ServerError
	if aof && errors.As(err, &se) && se.Code() == "ERR" &&
		strings.Contains(strings.ToLower(string(se)), "unknown command") {
		// A server before WAITAOF: the write is still this connection's last, so WAIT waits
		// for it as well.
		l.noWaitaof.Store(true)
		acks, err = l.wait(ctx, conn, false)
	}
	if err != nil {
		return false, err
	}
	enough := acks >= int64(l.durability.Replicas)
	if enough {
		l.acks.Add(1)
	} else {
		l.short.Add(1)
	}
	return enough, nil
}

// wait is how many replicas acknowledged conn's last write, by WAIT or WAITAOF.
func (l *lane) wait(ctx context.Context, conn Conn, aof bool) (int64, error) {
	ms := l.durability.Timeout.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	var args []interface{}
	if aof {
		args = []interface{}{"WAITAOF", "0", integer(int64(l.durability.Replicas)), integer(ms)}
	} else {
		args = []interface{}{"WAIT", integer(int64(l.durability.Replicas)), integer(ms)}
	}
	reply, err := do(ctx, conn, args...)
	if err != nil {
		return 0, err
	}
	if aof {
		// [fsynced locally, replicas that fsynced]
		items, ok := reply.([]interface{})
		if !ok || len(items) != 2 {
			return 0, errUnexpected{reply}
		}
		n, ok := asInt(items[1])
		if !ok {
			return 0, errUnexpected{reply}
		}
		return n, nil
	}
	n, ok := asInt(reply)
	if !ok {
		return 0, errUnexpected{reply}
	}
	return n, nil
}
