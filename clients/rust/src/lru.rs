//! A map of at most a fixed number of entries that evicts the least recently used one: the
//! bounded tables of the batches and of the deny cache.

use std::collections::HashMap;

const NIL: usize = usize::MAX;

struct Node<V> {
    key: String,
    value: V,
    prev: usize,
    next: usize,
}

/// Entries in a slab, linked from the most recently used (`head`) to the least (`tail`).
pub(crate) struct Lru<V> {
    index: HashMap<String, usize>,
    nodes: Vec<Option<Node<V>>>,
    free: Vec<usize>,
    head: usize,
    tail: usize,
    capacity: usize,
}

impl<V> Lru<V> {
    /// At most `capacity` entries (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        Lru {
            index: HashMap::new(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            capacity: capacity.max(1),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    fn node(&mut self, i: usize) -> Option<&mut Node<V>> {
        self.nodes.get_mut(i).and_then(Option::as_mut)
    }

    fn unlink(&mut self, i: usize) {
        let Some((prev, next)) = self.node(i).map(|n| (n.prev, n.next)) else {
            return;
        };
        match self.node(prev) {
            Some(p) => p.next = next,
            None => self.head = next,
        }
        match self.node(next) {
            Some(n) => n.prev = prev,
            None => self.tail = prev,
        }
    }

    fn push_front(&mut self, i: usize) {
        let head = self.head;
        if let Some(n) = self.node(i) {
            n.prev = NIL;
            n.next = head;
        }
        if let Some(h) = self.node(head) {
            h.prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    /// The entry of `key`, now the most recently used.
    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let i = *self.index.get(key)?;
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
        self.node(i).map(|n| &mut n.value)
    }

    /// Inserts (or replaces) `key`'s entry as the most recently used; the entry evicted to make
    /// room, if any.
    pub(crate) fn insert(&mut self, key: &str, value: V) -> Option<(String, V)> {
        if let Some(v) = self.get_mut(key) {
            *v = value;
            return None;
        }
        let evicted = if self.index.len() >= self.capacity {
            self.pop_lru()
        } else {
            None
        };
        let node = Node {
            key: key.to_string(),
            value,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = Some(node);
                i
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        };
        self.index.insert(key.to_string(), i);
        self.push_front(i);
        evicted
    }

    /// Removes `key`'s entry.
    pub(crate) fn remove(&mut self, key: &str) -> Option<V> {
        let i = self.index.remove(key)?;
        self.unlink(i);
        self.free.push(i);
        self.nodes.get_mut(i)?.take().map(|n| n.value)
    }

    fn pop_lru(&mut self) -> Option<(String, V)> {
        let i = self.tail;
        let key = self.nodes.get(i)?.as_ref()?.key.clone();
        self.remove(&key).map(|v| (key, v))
    }

    /// Every entry, in no particular order.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = (&str, &mut V)> {
        self.nodes
            .iter_mut()
            .flatten()
            .map(|n| (n.key.as_str(), &mut n.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut l = Lru::new(3);
        assert!(l.insert("a", 1).is_none());
        assert!(l.insert("b", 2).is_none());
        assert!(l.insert("c", 3).is_none());
        assert_eq!(l.get_mut("a"), Some(&mut 1));
        assert_eq!(l.insert("d", 4), Some(("b".to_string(), 2)));
        assert_eq!(l.insert("c", 30), None, "replaced in place");
        assert_eq!(l.insert("e", 5), Some(("a".to_string(), 1)));
        assert_eq!(l.len(), 3);
        assert_eq!(l.remove("d"), Some(4));
        assert_eq!(l.remove("d"), None);
        assert!(l.insert("f", 6).is_none());
        assert_eq!(l.insert("g", 7), Some(("c".to_string(), 30)));
        let mut all: Vec<(String, i32)> =
            l.values_mut().map(|(k, v)| (k.to_string(), *v)).collect();
        all.sort();
        assert_eq!(all, vec![("e".into(), 5), ("f".into(), 6), ("g".into(), 7)]);
        // The slab never grows past the capacity.
        for i in 0..1000 {
            l.insert(&format!("k{i}"), i);
        }
        assert_eq!((l.len(), l.nodes.len()), (3, 3));
    }
}
