//! The memory limit: an allocator that counts the isolate's heap and refuses to grow past it.
//!
//! QuickJS's own `JS_SetMemoryLimit` also refuses allocations, but it cannot tell the host
//! that it did, and sandboxed code may catch the resulting "out of memory" error and carry
//! on. Counting in the allocator gives a sticky flag instead: once an allocation has been
//! refused the interrupt handler stops the isolate, and the execution settles as `memory`
//! whatever the code did with the error.
//!
//! The limit applies from the moment caller code could run: QuickJS does not survive
//! running out of memory while it builds its runtime and intrinsics, so set-up runs
//! unbounded, and [`MemoryControl::enforce`] then reports a set-up that already exceeds the
//! caller's limit as an overrun.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rquickjs::allocator::{Allocator, RustAllocator};

/// The allocator's counters, shared with the isolate's event loop.
#[derive(Clone)]
pub(crate) struct MemoryControl {
    used: Arc<AtomicUsize>,
    limit: Arc<AtomicUsize>,
    requested: usize,
    exceeded: Arc<AtomicBool>,
}

impl MemoryControl {
    /// Applies the caller's limit; `false` (and the overrun flag) when set-up already
    /// holds more than it.
    pub fn enforce(&self) -> bool {
        self.limit.store(self.requested, Ordering::Relaxed);
        if self.used.load(Ordering::Relaxed) > self.requested {
            self.exceeded.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Set once an allocation has been refused; never cleared.
    pub fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::Relaxed)
    }
}

/// Rust's global allocator, bounded at `limit` bytes of live allocations.
pub(crate) struct LimitedAllocator {
    inner: RustAllocator,
    control: MemoryControl,
}

impl LimitedAllocator {
    /// An allocator that will refuse to hold more than `limit` bytes once
    /// [`MemoryControl::enforce`] is called (until then it refuses nothing).
    pub fn new(limit: usize) -> Self {
        Self {
            inner: RustAllocator,
            control: MemoryControl {
                used: Arc::new(AtomicUsize::new(0)),
                limit: Arc::new(AtomicUsize::new(usize::MAX)),
                requested: limit,
                exceeded: Arc::new(AtomicBool::new(false)),
            },
        }
    }

    /// The handle the event loop uses to apply and watch the limit.
    pub fn control(&self) -> MemoryControl {
        self.control.clone()
    }

    fn admit(&self, extra: usize) -> bool {
        let used = self.control.used.load(Ordering::Relaxed);
        if used.saturating_add(extra) > self.control.limit.load(Ordering::Relaxed) {
            self.control.exceeded.store(true, Ordering::Relaxed);
            false
        } else {
            true
        }
    }

    fn grow(&self, bytes: usize) {
        self.control.used.fetch_add(bytes, Ordering::Relaxed);
    }

    fn shrink(&self, bytes: usize) {
        let _ = self
            .control
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(bytes))
            });
    }
}

// SAFETY: every method delegates to `RustAllocator`, which upholds the trait's contract;
// this wrapper only refuses requests (returning null, which QuickJS handles as out of
// memory) and keeps a count using the inner allocator's own `usable_size`.
unsafe impl Allocator for LimitedAllocator {
    fn alloc(&mut self, size: usize) -> *mut u8 {
        if !self.admit(size) {
            return std::ptr::null_mut();
        }
        let ptr = self.inner.alloc(size);
        if !ptr.is_null() {
            // SAFETY: `ptr` was just returned by the inner allocator.
            self.grow(unsafe { RustAllocator::usable_size(ptr) });
        }
        ptr
    }

    fn calloc(&mut self, count: usize, size: usize) -> *mut u8 {
        // The inner allocator panics on overflow; refuse instead (a panic may not cross FFI).
        let Some(total) = count.checked_mul(size) else {
            self.control.exceeded.store(true, Ordering::Relaxed);
            return std::ptr::null_mut();
        };
        if !self.admit(total) {
            return std::ptr::null_mut();
        }
        let ptr = self.inner.calloc(count, size);
        if !ptr.is_null() {
            // SAFETY: `ptr` was just returned by the inner allocator.
            self.grow(unsafe { RustAllocator::usable_size(ptr) });
        }
        ptr
    }

    unsafe fn dealloc(&mut self, ptr: *mut u8) {
        // SAFETY: the caller guarantees `ptr` came from this allocator, hence the inner one.
        let size = unsafe { RustAllocator::usable_size(ptr) };
        self.shrink(size);
        // SAFETY: as above.
        unsafe { self.inner.dealloc(ptr) }
    }

    unsafe fn realloc(&mut self, ptr: *mut u8, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `ptr` came from this allocator, hence the inner one.
        let old = unsafe { RustAllocator::usable_size(ptr) };
        if new_size > old && !self.admit(new_size - old) {
            return std::ptr::null_mut();
        }
        // SAFETY: as above; on failure the old block stays valid and counted.
        let new = unsafe { self.inner.realloc(ptr, new_size) };
        if !new.is_null() {
            // SAFETY: `new` was just returned by the inner allocator.
            let size = unsafe { RustAllocator::usable_size(new) };
            self.shrink(old);
            self.grow(size);
        }
        new
    }

    unsafe fn usable_size(ptr: *mut u8) -> usize {
        // SAFETY: the caller guarantees `ptr` came from this allocator, hence the inner one.
        unsafe { RustAllocator::usable_size(ptr) }
    }
}
