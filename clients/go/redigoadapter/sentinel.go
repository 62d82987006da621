package redigoadapter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Sentinel is a ratelimit.Conn to the master that a set of Sentinels name, following it across
// failovers: it asks the Sentinels (SENTINEL GET-MASTER-ADDR-BY-NAME, each in turn) where the
// master is, checks with ROLE that the address answers as one, and sends every command there
// through a redigo pool of its own. When a command meets a failed connection (the master died,
// or a Sentinel closed it when it reconfigured the old master), a timeout, or READONLY (the
// master became a replica), that pool is dropped and the next command asks the Sentinels again.
// The command that met the failure still fails, so the client's failure policy (or, for
// READONLY, its *RejectedError) answers it; none is sent twice. Safe for concurrent use.
type Sentinel struct {
	sentinels []string
	master    string
	dial      []redis.DialOption
	// MaxIdle of the master's pool (default 64).
	MaxIdle int

	mu   sync.Mutex
	pool *redis.Pool
}

// NewSentinel follows the master named master, asking the Sentinels at sentinels
// ("host:port" each); dial are the options of every connection (to the Sentinels and the
// master), the context's deadline bounding each dial too. Nothing is dialed before the first
// command.
func NewSentinel(sentinels []string, master string, dial ...redis.DialOption) *Sentinel {
	return &Sentinel{sentinels: append([]string(nil), sentinels...), master: master, dial: dial,
		MaxIdle: 64}
}

// MasterAddress is the master's address ("host:port") the Sentinels name now, asking them in
// turn.
func (s *Sentinel) MasterAddress(ctx context.Context) (string, error) {
	var errs []string
	for _, addr := range s.sentinels {
		a, err := s.ask(ctx, addr)
		if err == nil {
			return a, nil
		}
		errs = append(errs, addr+": "+err.Error())
	}
	return "", fmt.Errorf("redigoadapter: no master reachable through the Sentinels (%s)",
		strings.Join(errs, "; "))
}

func (s *Sentinel) dialCtx(ctx context.Context, addr string) (redis.Conn, error) {
	opts := s.dial
	if d, ok := ctx.Deadline(); ok {
		t := time.Until(d)
		if t <= 0 {
			return nil, context.DeadlineExceeded
		}
		opts = append(append([]redis.DialOption(nil), opts...), redis.DialConnectTimeout(t),
			redis.DialReadTimeout(t), redis.DialWriteTimeout(t))
	}
	return redis.Dial("tcp", addr, opts...)
}

// ask is one Sentinel's answer, checked with ROLE at the address it names.
func (s *Sentinel) ask(ctx context.Context, sentinel string) (string, error) {
	c, err := s.dialCtx(ctx, sentinel)
	if err != nil {
		return "", err
	}
	hostPort, err := redis.Strings(c.Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.master))
	c.Close()
	if err != nil {
		return "", err
	}
	if len(hostPort) != 2 {
		return "", fmt.Errorf("no master named %q", s.master)
	}
	addr := net.JoinHostPort(hostPort[0], hostPort[1])
	m, err := s.dialCtx(ctx, addr)
	if err != nil {
		return "", err
	}
	defer m.Close()
	role, err := redis.Values(m.Do("ROLE"))
	if err != nil {
		return "", err
	}
	if len(role) == 0 {
		return "", errors.New("ROLE answered nothing")
	}
	if r, _ := redis.String(role[0], nil); r != "master" {
		return "", fmt.Errorf("%s is a %s", addr, r)
	}
	return addr, nil
}

// current is the master's pool, found through the Sentinels if none is known.
func (s *Sentinel) current(ctx context.Context) (*redis.Pool, error) {
	s.mu.Lock()
	p := s.pool
	s.mu.Unlock()
	if p != nil {
		return p, nil
	}
	addr, err := s.MasterAddress(ctx)
	if err != nil {
		return nil, err
	}
	dial := s.dial
	p = &redis.Pool{MaxIdle: s.MaxIdle, IdleTimeout: time.Minute,
		Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr, dial...) }}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pool != nil {
		// Another command found it meanwhile.
		p.Close()
		return s.pool, nil
	}
	s.pool = p
	return p, nil
}

// forget drops p if it is still the master's pool: the next command asks the Sentinels.
func (s *Sentinel) forget(p *redis.Pool) {
	s.mu.Lock()
	if s.pool == p {
		s.pool = nil
	}
	s.mu.Unlock()
	p.Close()
}

// lost says whether err means the connection no longer reaches the master: READONLY, or any
// error that is not a reply of the server.
func lost(err error) bool {
	if err == nil {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		return strings.HasPrefix(string(re), "READONLY")
	}
	return true
}

// Do sends one command to the master.
func (s *Sentinel) Do(ctx context.Context, args ...interface{}) (interface{}, error) {
	if len(args) == 0 {
		return nil, ErrNoCommand
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := s.current(ctx)
	if err != nil {
		return nil, err
	}
	reply, err := Pool{p}.Do(ctx, args...)
	if lost(err) {
		s.forget(p)
	}
	return reply, err
}

// Pin lends one connection to the master for several commands in a row (ratelimit.Pinner).
func (s *Sentinel) Pin(ctx context.Context) (func(ctx context.Context, args ...interface{}) (interface{},
	error), func(), error) {
	p, err := s.current(ctx)
	if err != nil {
		return nil, nil, err
	}
	do, release, err := Pool{p}.Pin(ctx)
	if err != nil {
		if lost(err) {
			s.forget(p)
		}
		return nil, nil, err
	}
	return func(ctx context.Context, args ...interface{}) (interface{}, error) {
		reply, err := do(ctx, args...)
		if lost(err) {
			s.forget(p)
		}
		return reply, err
	}, release, nil
}
