//! The one thread that keeps the module's caches (the last arguments each limiter parsed, and
//! `RL.TOP`'s keys): the server's main thread, which claims it at module load.
//!
//! Redis runs a module's commands, configuration callbacks, INFO and unload on its main thread,
//! one at a time, so a value only that thread reaches needs no lock and no thread-local storage.
//! (A thread-local is reached in a module through `__tls_get_addr`, and its accessor is a call
//! the compiler does not inline: about 40 instructions per use.) A command that a module thread
//! runs through `RM_Call`, with the server's lock held, finds the caches closed: its arguments
//! are parsed and its denials are not tracked.

use std::sync::atomic::{AtomicUsize, Ordering};

/// `pthread_self` of the owning thread; 0 until one claims.
static OWNER: AtomicUsize = AtomicUsize::new(0);

/// This thread's `pthread_t`, unique among the process's live threads.
#[inline(always)]
fn this_thread() -> usize {
    // SAFETY: `pthread_self` has no preconditions.
    (unsafe { libc::pthread_self() }) as usize
}

/// Makes this thread the owner when there is none (module load, on the server's main thread);
/// whether this thread is the owner.
pub fn claim() -> bool {
    let me = this_thread();
    match OWNER.compare_exchange(0, me, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => true,
        Err(owner) => owner == me,
    }
}

/// A value that only the owning thread reaches.
pub struct Owned<T> {
    value: T,
}

// SAFETY: `Owned::get` hands the value out only on the thread whose `pthread_t` is `OWNER`; no two
// live threads share a `pthread_t`, and `OWNER` is set once, so the value is never reached from two
// threads at once (`T: Send`: a thread that ends can pass its `pthread_t`, and the value, to a
// later one). The value itself may be `!Sync` (a `Cell`): references to it cannot leave the thread.
unsafe impl<T: Send> Sync for Owned<T> {}

impl<T> Owned<T> {
    pub const fn new(value: T) -> Self {
        Owned { value }
    }

    /// The value, on the owning thread; `None` on any other.
    #[inline(always)]
    pub fn get(&self) -> Option<&T> {
        (OWNER.load(Ordering::Relaxed) == this_thread()).then_some(&self.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn only_the_owner_reaches_an_owned_value() {
        static VALUE: Owned<Cell<u32>> = Owned::new(Cell::new(0));
        // Whichever test thread claims first owns for the whole test process, and a later thread
        // may be given an owner's `pthread_t` once that owner has ended: what holds either way.
        let owner = claim();
        assert_eq!(VALUE.get().is_some(), owner);
        assert_eq!(claim(), owner, "a second claim changes nothing");
        if owner {
            // This thread is alive, so no other thread has its `pthread_t`.
            let elsewhere = std::thread::spawn(|| (claim(), VALUE.get().map(Cell::get)))
                .join()
                .unwrap();
            assert_eq!(elsewhere, (false, None), "another thread is refused");
        }
    }
}
