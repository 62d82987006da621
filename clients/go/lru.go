package ratelimit

import "container/list"

// lru is a map of at most a fixed number of entries that evicts the least recently used one:
// the bounded tables of the batches and of the deny cache. Not safe for concurrent use (its
// owner locks it).
type lru[V any] struct {
	index    map[string]*list.Element
	order    *list.List // most recently used first
	capacity int
}

type lruEntry[V any] struct {
	key   string
	value V
}

func newLRU[V any](capacity int) *lru[V] {
	if capacity < 1 {
		capacity = 1
	}
	return &lru[V]{index: map[string]*list.Element{}, order: list.New(), capacity: capacity}
}

func (l *lru[V]) len() int { return len(l.index) }

// get is key's entry, now the most recently used.
func (l *lru[V]) get(key string) (*V, bool) {
	e, ok := l.index[key]
	if !ok {
		return nil, false
	}
	l.order.MoveToFront(e)
	return &e.Value.(*lruEntry[V]).value, true
}

// peek is key's entry, its place unchanged.
func (l *lru[V]) peek(key string) (*V, bool) {
	e, ok := l.index[key]
	if !ok {
		return nil, false
	}
	return &e.Value.(*lruEntry[V]).value, true
}

// insert sets key's entry (the most recently used); when that makes one too many, the least
// recently used is removed and returned.
func (l *lru[V]) insert(key string, v V) (string, V, bool) {
	if e, ok := l.index[key]; ok {
		e.Value.(*lruEntry[V]).value = v
		l.order.MoveToFront(e)
		var zero V
		return "", zero, false
	}
	l.index[key] = l.order.PushFront(&lruEntry[V]{key, v})
	if len(l.index) <= l.capacity {
		var zero V
		return "", zero, false
	}
	last := l.order.Back()
	old := last.Value.(*lruEntry[V])
	l.order.Remove(last)
	delete(l.index, old.key)
	return old.key, old.value, true
}

// remove drops key's entry: its value, if it had one.
func (l *lru[V]) remove(key string) (V, bool) {
	e, ok := l.index[key]
	if !ok {
		var zero V
		return zero, false
	}
	l.order.Remove(e)
	delete(l.index, key)
	return e.Value.(*lruEntry[V]).value, true
}

// each calls f with every entry, the most recently used first.
func (l *lru[V]) each(f func(key string, v *V)) {
	for e := l.order.Front(); e != nil; e = e.Next() {
		en := e.Value.(*lruEntry[V])
		f(en.key, &en.value)
	}
}
