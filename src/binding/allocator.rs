//! Global allocator: Redis's allocator inside redis-server (so `INFO memory` counts our memory),
//! the system allocator everywhere else (unit tests, integration tests and benches link this
//! crate as an ordinary library, where Redis never hands us its API).
//!
//! The choice cannot change during a process's life: inside Redis the API pointers are filled in
//! by `RedisModule_Init`, before any of our code allocates, and they are never cleared.

use std::alloc::{GlobalAlloc, Layout, System};

use redis_module::alloc::RedisAlloc;
use redis_module::raw;

pub struct ModuleAllocator;

fn inside_redis() -> bool {
    // SAFETY: a plain read of a function pointer that is written once, at module load.
    let alloc = unsafe { raw::RedisModule_Alloc };
    alloc.is_some()
}

unsafe impl GlobalAlloc for ModuleAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged to an allocator that upholds GlobalAlloc's contract.
        unsafe {
            if inside_redis() {
                RedisAlloc.alloc(layout)
            } else {
                System.alloc(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from the same allocator, since the choice never changes.
        unsafe {
            if inside_redis() {
                RedisAlloc.dealloc(ptr, layout)
            } else {
                System.dealloc(ptr, layout)
            }
        }
    }
}
