/**
 * A map of at most a fixed number of entries that evicts the least recently used one: the
 * bounded tables of the batches and of the deny cache. A `Map` keeps its keys in the order they
 * were set: an entry used is set again, so the first key is the least recently used.
 */
export class Lru<V> {
  private readonly entries = new Map<string, V>();
  readonly capacity: number;

  /** At most `capacity` entries (at least 1). */
  constructor(capacity: number) {
    this.capacity = Math.max(Math.trunc(capacity), 1);
  }

  get size(): number {
    return this.entries.size;
  }

  /** The entry of `key`, made the most recently used. */
  get(key: string): V | undefined {
    const v = this.entries.get(key);
    if (v === undefined) return undefined;
    this.entries.delete(key);
    this.entries.set(key, v);
    return v;
  }

  /** The entry of `key`, its place unchanged. */
  peek(key: string): V | undefined {
    return this.entries.get(key);
  }

  /** Sets `key` as the most recently used; the entry evicted to make room, if one was. */
  set(key: string, value: V): [string, V] | undefined {
    let evicted: [string, V] | undefined;
    if (this.entries.has(key)) this.entries.delete(key);
    else if (this.entries.size >= this.capacity) {
      const first = this.entries.entries().next();
      if (!first.done) {
        evicted = first.value;
        this.entries.delete(first.value[0]);
      }
    }
    this.entries.set(key, value);
    return evicted;
  }

  delete(key: string): V | undefined {
    const v = this.entries.get(key);
    this.entries.delete(key);
    return v;
  }

  /** Every entry, least recently used first. */
  all(): Array<[string, V]> {
    return [...this.entries.entries()];
  }

  clear(): void {
    this.entries.clear();
  }
}
