//! The library's allocator: the C library's (`std::alloc::System`), except while this thread
//! runs a handler of the program ([`crate::signals::in_handler`]).
//!
//! A handler may have interrupted `malloc` or `free` half way (its arena lock held, or, in a
//! process that never had a second thread, its lists half updated: glibc takes no lock then).
//! Any work of ours beyond a ring's fast path allocates: a handler's `send` that drives a
//! handshake, a handler-forked child whose exec switches connections to TCP, the parent's next
//! call on such a connection (red team round 17, `sigsafe_run.sh 2 sendonly 100 200 NB=1
//! NBX=1`: `corrupted double-linked list`, the process aborted, 2 runs of 2; TCP exact). So
//! in a handler:
//! - allocations come from [`ARENAS`] arenas of one anonymous mapping ([`ARENA_BYTES`] each,
//!   reserved at the first such allocation with `mmap`, which is a system call and safe
//!   there), bump-allocated with one atomic word per arena (live allocations, top); an arena
//!   whose allocations were all freed starts again from its beginning. An allocation the
//!   arenas cannot hold (larger than an arena, alignment beyond a page, every arena full of
//!   live blocks) is `malloc`'s, as before;
//! - frees of `malloc`'s blocks are deferred: pushed on a lock-free list (through the block's
//!   own first word: glibc's smallest block has 24 usable bytes) that this allocator empties
//!   at the next allocation or free of any thread outside a handler.
//!
//! Outside handlers the only cost is a thread-local read, one relaxed load (deferred frees),
//! and on a free one compare against the arena range.
use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// Arenas, and the bytes of each (one mapping of both multiplied, reserved, not committed:
/// only the pages handlers touch cost memory).
const ARENAS: usize = 16;
const ARENA_BYTES: usize = 4 << 20;
/// The packed arena word: live allocations above this bit, the top offset below.
const LIVE_SHIFT: u32 = 40;
const TOP_MASK: u64 = (1 << LIVE_SHIFT) - 1;
const LIVE_MAX: u64 = (1 << (64 - LIVE_SHIFT)) - 1;
const PAGE: usize = 4096;

/// The mapping's base (0: not reserved yet).
static BASE: AtomicUsize = AtomicUsize::new(0);
/// Per arena: `live << LIVE_SHIFT | top`.
static WORDS: [AtomicU64; ARENAS] = [const { AtomicU64::new(0) }; ARENAS];
/// The arena handlers allocate from first.
static CURRENT: AtomicUsize = AtomicUsize::new(0);
/// `malloc`'s blocks freed in handlers, to give back outside them.
static DEFERRED: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());

pub struct HandlerAlloc;

/// The arena mapping, reserved at the first call (racing reservations: one wins, the others
/// unmap theirs). `None` when the kernel refuses.
fn base() -> Option<usize> {
    let b = BASE.load(Ordering::Acquire);
    if b != 0 {
        return Some(b);
    }
    let len = ARENAS * ARENA_BYTES;
    // SAFETY: a new private anonymous mapping, no address asked for; `mmap` is a system call,
    // safe in a signal handler.
    let m = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if m == libc::MAP_FAILED {
        return None;
    }
    match BASE.compare_exchange(0, m as usize, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(m as usize),
        Err(won) => {
            // SAFETY: our own mapping of `len` bytes, never handed out.
            unsafe { libc::munmap(m, len) };
            Some(won)
        }
    }
}

/// Which arena `p` lies in, if any.
fn arena_of(p: *mut u8) -> Option<usize> {
    let b = BASE.load(Ordering::Acquire);
    let a = p as usize;
    (b != 0 && a >= b && a < b + ARENAS * ARENA_BYTES).then(|| (a - b) / ARENA_BYTES)
}

/// A block of `layout` from arena `i`, if it has room (an arena whose blocks were all freed
/// starts again at its beginning).
fn bump(base: usize, i: usize, layout: Layout) -> Option<*mut u8> {
    let word = WORDS.get(i)?;
    let mut w = word.load(Ordering::Acquire);
    loop {
        let live = w >> LIVE_SHIFT;
        let top = if live == 0 {
            0
        } else {
            (w & TOP_MASK) as usize
        };
        let start = top.checked_add(layout.align() - 1)? & !(layout.align() - 1);
        let end = start.checked_add(layout.size())?;
        if end > ARENA_BYTES || live >= LIVE_MAX {
            return None;
        }
        let new = ((live + 1) << LIVE_SHIFT) | end as u64;
        match word.compare_exchange_weak(w, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some((base + i * ARENA_BYTES + start) as *mut u8),
            Err(now) => w = now,
        }
    }
}

/// A block of `layout` from the arenas, or null when they cannot hold it.
fn arena_alloc(layout: Layout) -> *mut u8 {
    if layout.align() > PAGE || layout.size() > ARENA_BYTES / 4 {
        return ptr::null_mut();
    }
    let Some(base) = base() else {
        return ptr::null_mut();
    };
    let first = CURRENT.load(Ordering::Relaxed) % ARENAS;
    for k in 0..ARENAS {
        let i = (first + k) % ARENAS;
        if let Some(p) = bump(base, i, layout) {
            if k != 0 {
                CURRENT.store(i, Ordering::Relaxed);
            }
            return p;
        }
    }
    ptr::null_mut()
}

/// Frees a block of arena `i`.
fn arena_free(i: usize) {
    if let Some(w) = WORDS.get(i) {
        w.fetch_sub(1 << LIVE_SHIFT, Ordering::AcqRel);
    }
}

/// Defers the free of `malloc`'s block `p` (in a handler).
fn defer_free(p: *mut u8) {
    let mut head = DEFERRED.load(Ordering::Acquire);
    loop {
        // SAFETY: `p` is a live block of glibc's `malloc` (at least 24 usable bytes, 8-aligned)
        // that its owner just gave up: its first word is ours until it is freed.
        unsafe { p.cast::<*mut u8>().write(head) };
        match DEFERRED.compare_exchange_weak(head, p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(now) => head = now,
        }
    }
}

/// Gives the deferred blocks back to `malloc` (outside handlers only). The whole list is taken
/// at once, so no block is ever popped twice.
fn drain_deferred() {
    if DEFERRED.load(Ordering::Relaxed).is_null() {
        return;
    }
    let mut p = DEFERRED.swap(ptr::null_mut(), Ordering::AcqRel);
    while !p.is_null() {
        // SAFETY: a block `defer_free` pushed, its first word the next one.
        let next = unsafe { p.cast::<*mut u8>().read() };
        // SAFETY: a block of `malloc`'s that nobody uses any more.
        unsafe { libc::free(p.cast()) };
        p = next;
    }
}

// SAFETY: every block handed out is either `System`'s (freed by `System`, or deferred then
// freed with `free`, which is what `System` uses for every layout on this target) or a range of
// an arena that no other live block overlaps (bump allocation; an arena starts again only once
// its live count is zero), aligned as asked.
unsafe impl GlobalAlloc for HandlerAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if crate::signals::in_handler() {
            let p = arena_alloc(layout);
            if !p.is_null() {
                return p;
            }
        } else {
            drain_deferred();
        }
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if crate::signals::in_handler() {
            let p = arena_alloc(layout);
            if !p.is_null() {
                // SAFETY: a fresh arena block of `layout.size()` bytes (reused memory: zeroed here).
                unsafe { p.write_bytes(0, layout.size()) };
                return p;
            }
        } else {
            drain_deferred();
        }
        // SAFETY: the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if let Some(i) = arena_of(p) {
            arena_free(i);
            return;
        }
        if crate::signals::in_handler() {
            defer_free(p);
            return;
        }
        drain_deferred();
        // SAFETY: a block `System` allocated with `layout` (not an arena's: checked above).
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if arena_of(p).is_none() && !crate::signals::in_handler() {
            drain_deferred();
            // SAFETY: a block `System` allocated with `layout`, the caller's new size.
            return unsafe { System.realloc(p, layout, new_size) };
        }
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return ptr::null_mut();
        };
        // SAFETY: a valid non-zero layout (the caller's contract for `realloc`).
        let q = unsafe { self.alloc(new) };
        if !q.is_null() {
            // SAFETY: both blocks are live and distinct, each at least this long.
            unsafe { ptr::copy_nonoverlapping(p, q, layout.size().min(new_size)) };
            // SAFETY: the caller's block and layout.
            unsafe { self.dealloc(p, layout) };
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_blocks_are_aligned_distinct_and_reused_once_all_are_freed() {
        let base = base().expect("mapping");
        let l = |size, align| Layout::from_size_align(size, align).unwrap();
        let i = ARENAS - 1;
        let a = bump(base, i, l(3, 1)).unwrap();
        let b = bump(base, i, l(64, 64)).unwrap();
        assert_eq!(b as usize % 64, 0);
        assert!(b as usize >= a as usize + 3);
        assert_eq!(arena_of(a), Some(i));
        assert_eq!(arena_of(b), Some(i));
        arena_free(i);
        // One live block: no reuse yet.
        let c = bump(base, i, l(8, 8)).unwrap();
        assert!(c as usize > b as usize);
        arena_free(i);
        arena_free(i);
        // All freed: the arena starts again.
        let d = bump(base, i, l(8, 8)).unwrap();
        assert_eq!(d as usize, base + i * ARENA_BYTES);
        arena_free(i);
        assert!(bump(base, i, l(ARENA_BYTES + 1, 1)).is_none());
        assert_eq!(arena_of(std::ptr::null_mut()), None);
    }

    #[test]
    fn frees_deferred_in_a_handler_go_back_outside() {
        // SAFETY: plain allocations, given up at once.
        let p = unsafe { libc::malloc(32) }.cast::<u8>();
        // SAFETY: as above.
        let q = unsafe { libc::malloc(1) }.cast::<u8>();
        assert!(!p.is_null() && !q.is_null());
        defer_free(p);
        defer_free(q);
        drain_deferred();
        assert!(DEFERRED.load(Ordering::Acquire).is_null());
    }
}
