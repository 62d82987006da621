package redigoadapter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/mna/redisc"
)

// Cluster is a ratelimit.Conn (and a ratelimit.Pinner) to a Redis Cluster, on redisc
// (github.com/mna/redisc): each command goes to the master of its key's slot (the first key of
// RL.ALL, RL.SETTLE, EVAL, EVALSHA and FCALL; a command without a key to any master), through a
// redigo pool per node, and MOVED and ASK are followed (at most 4 redirections; TRYAGAIN is
// tried again 4 times, 20 ms apart, within the deadline).
//
// A master that froze (stopped, or cut off without its connections closing) answers nothing, so
// no redirection comes and redisc's slot map would keep naming it. Here a command that got no
// answer (a failed connection, a timeout, a context done before the reply) drops the slot map
// and its pools, and reads the slots again in the background: every node known (the startup
// nodes and those the last map named) is asked CLUSTER SLOTS at once, and the first to answer
// makes the new map. Meanwhile commands fail at once with ErrReadingSlots, so that the client's
// failure policy answers them without waiting on the frozen node; none is sent twice. As the
// node that answered first may not have heard of a promotion yet, the slots are then read again
// every 100 ms for 2 s, from every node that answers, and the map most of them give replaces
// the one in use when it differs. The first command waits for the first reading, within its
// context. Safe for concurrent use.
type Cluster struct {
	startup []string
	dial    []redis.DialOption
	// MaxIdle of each node's pool (default 64).
	MaxIdle int
	// NodeTimeout bounds each node's dial, and each read and write without a context deadline
	// (CLUSTER SLOTS, redisc's own reading of the slots after MOVED); default 1 s.
	NodeTimeout time.Duration

	mu      sync.Mutex
	cur     *redisc.Cluster
	reading chan struct{} // closed when the reading under way ends; nil when none is
	lastErr error         // why the last reading failed
	known   []string      // the nodes the last map named
	reads   uint64        // readings that made a map
	closed  bool
}

// ErrReadingSlots is the error of a command sent while the cluster's slots are read again (after
// a command that got no answer): a failure to reach Redis, which the failure policy answers.
var ErrReadingSlots = errors.New("redigoadapter: reading the cluster's slots again")

// ErrClusterClosed is the error of a command sent after Close.
var ErrClusterClosed = errors.New("redigoadapter: the cluster adapter is closed")

// NewCluster is a Cluster starting from the nodes at startup ("host:port" each); dial are the
// options of every connection, after the adapter's connect, read and write timeouts of
// NodeTimeout (so that a redis.DialReadTimeout among them wins). Nothing is dialed before the
// first command.
func NewCluster(startup []string, dial ...redis.DialOption) *Cluster {
	return &Cluster{startup: append([]string(nil), startup...), dial: dial, MaxIdle: 64,
		NodeTimeout: time.Second}
}

// Readings is how many maps of the slots were made so far (1 after the first command, then one
// after each command that got no answer, and one for each map that replaced a stale one).
func (c *Cluster) Readings() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads
}

func (c *Cluster) options() []redis.DialOption {
	t := c.NodeTimeout
	if t <= 0 {
		t = time.Second
	}
	return append([]redis.DialOption{redis.DialConnectTimeout(t), redis.DialReadTimeout(t),
		redis.DialWriteTimeout(t)}, c.dial...)
}

// current is the slot map in use. Without one, a reading starts (unless one is under way); the
// first command waits for it within ctx, any later one fails at once with ErrReadingSlots.
func (c *Cluster) current(ctx context.Context) (*redisc.Cluster, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClusterClosed
	}
	if c.cur != nil {
		cl := c.cur
		c.mu.Unlock()
		return cl, nil
	}
	first := c.reads == 0
	done := c.readLocked()
	c.mu.Unlock()
	if !first {
		return nil, ErrReadingSlots
	}
	select {
	case <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil {
		return c.cur, nil
	}
	if c.closed {
		return nil, ErrClusterClosed
	}
	return nil, c.lastErr
}

// After a map read following a command that got no answer, the slots are read again every
// confirmEvery for confirmFor, from every node that answers: a node asked first may not have
// heard of a promotion yet.
const (
	confirmEvery = 100 * time.Millisecond
	confirmFor   = 2 * time.Second
	// How long a reading from every node waits for more answers after the first.
	moreAnswers = 100 * time.Millisecond
)

// nodesLocked are the nodes to ask: the startup nodes and those the last map named. c.mu is
// held.
func (c *Cluster) nodesLocked() []string {
	nodes := append([]string(nil), c.startup...)
	for _, k := range c.known {
		if !contains(nodes, k) {
			nodes = append(nodes, k)
		}
	}
	return nodes
}

// readLocked starts reading the slots in the background unless a reading is under way: the
// channel that closes when it ends. c.mu is held.
func (c *Cluster) readLocked() chan struct{} {
	if c.reading != nil {
		return c.reading
	}
	done := make(chan struct{})
	c.reading = done
	nodes := c.nodesLocked()
	go func() {
		cl, m, err := c.readSlots(nodes)
		c.mu.Lock()
		defer c.mu.Unlock()
		defer close(done)
		c.reading = nil
		if err != nil {
			c.lastErr = err
			return
		}
		if c.closed {
			cl.Close()
			return
		}
		c.cur = cl
		c.known = m.named
		c.reads++
		if c.reads > 1 {
			go c.confirm(cl, m.print)
		}
	}()
	return done
}

// slotMap is one node's answer to CLUSTER SLOTS.
type slotMap struct {
	addr  string   // the node that answered
	named []string // the nodes it names
	print string   // its slot ranges and their masters, to compare answers
}

// probe asks every node of nodes for CLUSTER SLOTS at once: the first answer only, or with all
// every answer that comes within moreAnswers of the first; and why the others failed.
func (c *Cluster) probe(nodes []string, all bool) ([]slotMap, []string) {
	type answer struct {
		slotMap
		err error
	}
	answers := make(chan answer, len(nodes))
	opts := c.options()
	for _, addr := range nodes {
		go func(addr string) {
			conn, err := redis.Dial("tcp", addr, opts...)
			if err != nil {
				answers <- answer{slotMap: slotMap{addr: addr}, err: err}
				return
			}
			defer conn.Close()
			reply, err := conn.Do("CLUSTER", "SLOTS")
			m, err := parseSlots(addr, reply, err)
			answers <- answer{slotMap: m, err: err}
		}(addr)
	}
	var maps []slotMap
	var errs []string
	var enough <-chan time.Time
	for range nodes {
		select {
		case a := <-answers:
			if a.err != nil {
				errs = append(errs, a.addr+": "+a.err.Error())
				continue
			}
			maps = append(maps, a.slotMap)
			if !all {
				return maps, errs
			}
			if enough == nil {
				enough = time.After(moreAnswers)
			}
		case <-enough:
			return maps, errs
		}
	}
	return maps, errs
}

// build is a redisc.Cluster whose slots redisc read from the node at addr.
func (c *Cluster) build(addr string) (*redisc.Cluster, error) {
	maxIdle := c.MaxIdle
	cl := &redisc.Cluster{
		StartupNodes: []string{addr},
		DialOptions:  c.options(),
		CreatePool: func(addr string, opts ...redis.DialOption) (*redis.Pool, error) {
			return &redis.Pool{MaxIdle: maxIdle, IdleTimeout: time.Minute,
				Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr, opts...) }}, nil
		},
	}
	if err := cl.Refresh(); err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}

// readSlots asks every node of nodes for CLUSTER SLOTS at once; the first that answers makes a
// new redisc.Cluster: that cluster and the answer.
func (c *Cluster) readSlots(nodes []string) (*redisc.Cluster, slotMap, error) {
	maps, errs := c.probe(nodes, false)
	for _, m := range maps {
		cl, err := c.build(m.addr)
		if err == nil {
			return cl, m, nil
		}
		errs = append(errs, m.addr+": "+err.Error())
	}
	return nil, slotMap{}, fmt.Errorf("redigoadapter: no node answered CLUSTER SLOTS (%s)",
		strings.Join(errs, "; "))
}

// confirm reads the slots again, every confirmEvery for confirmFor, while cl (whose answer was
// print) is the map in use, and takes the map that most of the nodes answering give when it is
// another.
func (c *Cluster) confirm(cl *redisc.Cluster, print string) {
	for end := time.Now().Add(confirmFor); time.Now().Before(end); {
		time.Sleep(confirmEvery)
		c.mu.Lock()
		if c.cur != cl || c.closed {
			c.mu.Unlock()
			return
		}
		nodes := c.nodesLocked()
		c.mu.Unlock()
		maps, _ := c.probe(nodes, true)
		best, ok := mostGiven(maps, print)
		if !ok || best.print == print {
			continue
		}
		next, err := c.build(best.addr)
		if err != nil {
			continue
		}
		c.mu.Lock()
		if c.cur != cl || c.closed {
			c.mu.Unlock()
			next.Close()
			return
		}
		c.cur = next
		c.known = best.named
		c.reads++
		c.mu.Unlock()
		cl.Close()
		cl, print = next, best.print
	}
}

// mostGiven is the answer most of maps give (on a tie, current's if it is among them).
func mostGiven(maps []slotMap, current string) (slotMap, bool) {
	count := map[string]int{}
	for _, m := range maps {
		count[m.print]++
	}
	var best slotMap
	found := false
	for _, m := range maps {
		if !found || count[m.print] > count[best.print] ||
			(count[m.print] == count[best.print] && m.print == current) {
			best, found = m, true
		}
	}
	return best, found
}

// parseSlots is the CLUSTER SLOTS reply of the node at asked: the addresses ("host:port") it
// names, masters and replicas (an empty host is asked's own, as Redis means it), and each
// range's master.
func parseSlots(asked string, reply interface{}, err error) (slotMap, error) {
	m := slotMap{addr: asked}
	ranges, err := redis.Values(reply, err)
	if err != nil {
		return m, err
	}
	if len(ranges) == 0 {
		return m, errors.New("no slot is served")
	}
	var print []string
	for _, r := range ranges {
		fields, err := redis.Values(r, nil)
		if err != nil || len(fields) < 3 {
			return m, fmt.Errorf("a slot range of CLUSTER SLOTS is %v", r)
		}
		first, _ := redis.Int(fields[0], nil)
		last, _ := redis.Int(fields[1], nil)
		for i, n := range fields[2:] {
			node, err := redis.Values(n, nil)
			if err != nil || len(node) < 2 {
				return m, fmt.Errorf("a node of CLUSTER SLOTS is %v", n)
			}
			host, _ := redis.String(node[0], nil)
			if host == "" {
				host, _, _ = net.SplitHostPort(asked)
			}
			port, err := redis.Int(node[1], nil)
			if err != nil || host == "" {
				return m, fmt.Errorf("a node of CLUSTER SLOTS is %v", n)
			}
			addr := net.JoinHostPort(host, strconv.Itoa(port))
			if i == 0 {
				print = append(print, fmt.Sprintf("%d-%d %s", first, last, addr))
			}
			if !contains(m.named, addr) {
				m.named = append(m.named, addr)
			}
		}
	}
	sort.Strings(print)
	m.print = strings.Join(print, ",")
	return m, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// drop forgets cl if it is still the map in use, and reads the slots again.
func (c *Cluster) drop(cl *redisc.Cluster) {
	c.mu.Lock()
	if c.cur != cl {
		c.mu.Unlock()
		return
	}
	c.cur = nil
	if !c.closed {
		c.readLocked()
	}
	c.mu.Unlock()
	// Commands on its connections end by their deadlines; its pools close their connections as
	// they come back.
	cl.Close()
}

// unanswered says whether err came without an answer from Redis: any error that is not a reply
// of the server (a MOVED or ASK left over included, as no node answered the command itself).
func unanswered(err error) bool {
	if err == nil {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		return redisc.ParseRedir(re) != nil
	}
	return true
}

// Close closes the pools; commands sent afterwards fail with ErrClusterClosed.
func (c *Cluster) Close() error {
	c.mu.Lock()
	cl := c.cur
	c.cur = nil
	c.closed = true
	c.mu.Unlock()
	if cl != nil {
		return cl.Close()
	}
	return nil
}

// Do sends one command to the master of its key's slot.
func (c *Cluster) Do(ctx context.Context, args ...interface{}) (interface{}, error) {
	if len(args) == 0 {
		return nil, ErrNoCommand
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cl, err := c.current(ctx)
	if err != nil {
		return nil, err
	}
	s := &session{cluster: cl, dial: c.options()}
	defer s.close()
	reply, err := s.do(ctx, args...)
	if unanswered(err) {
		c.drop(cl)
	}
	return reply, err
}

// DoBy is Do ending by deadline (ratelimit.DeadlineConn, which the package ratelimit calls on
// the caller's goroutine): the command goes from a goroutine of its own, and a command with no
// answer by deadline (or by ctx's end) has dropped the slot map by the time DoBy returns, so
// that a call that waited for this one's place never finds the map of a master that froze.
func (c *Cluster) DoBy(ctx context.Context, deadline time.Time, args ...interface{}) (interface{},
	error) {
	if len(args) == 0 {
		return nil, ErrNoCommand
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	cl, err := c.current(ctx)
	if err != nil {
		return nil, err
	}
	type result struct {
		v   interface{}
		err error
	}
	done := make(chan result, 1)
	go func() {
		s := &session{cluster: cl, dial: c.options()}
		defer s.close()
		v, err := s.do(ctx, args...)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		if unanswered(r.err) {
			c.drop(cl)
		}
		return r.v, r.err
	case <-ctx.Done():
		c.drop(cl)
		return nil, ctx.Err()
	}
}

// Pin lends one connection for several commands in a row (ratelimit.Pinner): the first command
// binds it to the master of its key's slot (a redirection moves it to the node that answered),
// and the commands after it without a key (WAIT, WAITAOF) go to that same node.
func (c *Cluster) Pin(ctx context.Context) (func(ctx context.Context, args ...interface{}) (interface{},
	error), func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	cl, err := c.current(ctx)
	if err != nil {
		return nil, nil, err
	}
	s := &session{cluster: cl, dial: c.options()}
	var busy sync.WaitGroup
	do := func(ctx context.Context, args ...interface{}) (interface{}, error) {
		busy.Add(1)
		defer busy.Done()
		reply, err := s.do(ctx, args...)
		if unanswered(err) {
			c.drop(cl)
		}
		return reply, err
	}
	release := func() {
		go func() {
			busy.Wait()
			s.close()
		}()
	}
	return do, release, nil
}

// session is one connection of a cluster, bound to a node by its first command (or moved by a
// redirection). Not for concurrent use.
type session struct {
	cluster *redisc.Cluster
	dial    []redis.DialOption
	conn    redis.Conn
}

func (s *session) close() {
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}

// bind is a connection of the cluster bound to key's slot (to any master without a key).
func (s *session) bind(key string, keyed bool) (redis.Conn, error) {
	conn := s.cluster.Get()
	var err error
	if keyed {
		err = redisc.BindConn(conn, key)
	} else {
		err = redisc.BindConn(conn)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// dialed is a connection of its own to addr (the node an ASK names), within ctx's deadline.
func (s *session) dialed(ctx context.Context, addr string) (redis.Conn, error) {
	opts := s.dial
	if d, ok := ctx.Deadline(); ok {
		t := time.Until(d)
		if t <= 0 {
			return nil, context.DeadlineExceeded
		}
		opts = append(append([]redis.DialOption(nil), opts...), redis.DialConnectTimeout(t))
	}
	return redis.Dial("tcp", addr, opts...)
}

func (s *session) do(ctx context.Context, args ...interface{}) (interface{}, error) {
	name, ok := args[0].(string)
	if !ok || name == "" {
		return nil, fmt.Errorf("redigoadapter: the command name is %T, not a string", args[0])
	}
	key, keyed := keyOf(name, args[1:])
	if s.conn == nil {
		conn, err := s.bind(key, keyed)
		if err != nil {
			return nil, err
		}
		s.conn = conn
	}
	const redirections = 4
	asking, tryAgain := false, 0
	for hops := 0; ; {
		if asking {
			if _, err := doOn(ctx, s.conn, "ASKING"); err != nil {
				return nil, err
			}
			asking = false
		}
		reply, err := doOn(ctx, s.conn, args...)
		if redisc.IsTryAgain(err) && tryAgain < 4 {
			tryAgain++
			select {
			case <-time.After(20 * time.Millisecond):
				continue
			case <-ctx.Done():
				return reply, err
			}
		}
		re := redisc.ParseRedir(err)
		if re == nil || hops == redirections {
			return reply, err
		}
		hops++
		s.close()
		var conn redis.Conn
		if re.Type == "ASK" {
			conn, err = s.dialed(ctx, re.Addr)
			asking = true
		} else {
			// redisc moved the slot to re.Addr in its map when the MOVED came.
			conn, err = s.bind(key, keyed)
		}
		if err != nil {
			return nil, err
		}
		s.conn = conn
	}
}

// keyOf is the key a command is routed by: the first key of RL.ALL and RL.SETTLE (numkeys
// key...), of EVAL, EVALSHA and FCALL (script numkeys key...), none for the commands without
// one, else the first argument.
func keyOf(name string, args []interface{}) (string, bool) {
	at := 0
	switch strings.ToUpper(name) {
	case "RL.ALL", "RL.SETTLE":
		at = 1
	case "EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO":
		if len(args) < 2 {
			return "", false
		}
		if n, err := strconv.Atoi(text(args[1])); err != nil || n < 1 {
			return "", false
		}
		at = 2
	case "WAIT", "WAITAOF", "PING", "INFO", "ROLE", "COMMAND", "FUNCTION", "SCRIPT", "CLUSTER",
		"RL.TOP", "ASKING", "READONLY", "READWRITE", "DBSIZE", "TIME":
		return "", false
	}
	if len(args) <= at {
		return "", false
	}
	return text(args[at]), true
}

func text(v interface{}) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return fmt.Sprint(v)
}
