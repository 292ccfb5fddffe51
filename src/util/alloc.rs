//! The allocator of packfs's own Rust code: buffers of 1 MiB or more (decoded units, encoded
//! blocks, decoders' tables, chunks) are mapped for themselves and unmapped when freed, the
//! rest comes from the system's malloc. So memory packfs frees goes back to the kernel at once
//! and its resident memory follows the budget, in its own binary and as a module in someone
//! else's process alike, without touching the process's malloc: glibc otherwise carves such
//! buffers from per-thread arenas once its dynamic threshold rose, and keeps them there (16
//! Python threads over bzip2 -9 blocks held 141 MB against an 80 MiB budget; the daemon had
//! avoided it with `mallopt`, which a module may not do to its host).

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations from this size on are mapped for themselves.
pub const MAPPED_FROM: usize = 1 << 20;

pub struct LargeMapped;

const PAGE: usize = 4096;

fn mapped(layout: &Layout) -> bool {
    layout.size() >= MAPPED_FROM && layout.align() <= PAGE
}

fn round_up(size: usize) -> usize {
    size.div_ceil(PAGE) * PAGE
}

/// A fresh private anonymous mapping of at least `size` bytes (null when the kernel refuses).
fn map(size: usize) -> *mut u8 {
    // SAFETY: asks for a new mapping the kernel places; nothing else refers to it.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            round_up(size),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    match at {
        libc::MAP_FAILED => std::ptr::null_mut(),
        at => at.cast(),
    }
}

// SAFETY: every block handed out is valid for its layout until freed with the same layout, as
// the trait requires: mapped ones by mmap (page-aligned, at least `size` bytes), others by the
// system allocator, and each is freed by the one that made it (decided by the same layout).
unsafe impl GlobalAlloc for LargeMapped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if mapped(&layout) {
            return map(layout.size());
        }
        // SAFETY: the caller's layout, passed on as the trait requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if mapped(&layout) {
            // A fresh anonymous mapping reads as zeros: no pass over it.
            return map(layout.size());
        }
        // SAFETY: the caller's layout, passed on as the trait requires.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if mapped(&layout) {
            // SAFETY: a mapping `map` made for this layout's size, no longer used.
            unsafe { libc::munmap(ptr.cast(), round_up(layout.size())) };
            return;
        }
        // SAFETY: a block the system allocator made for this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size`, rounded up to `align`, fits an isize.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (mapped(&layout), mapped(&new)) {
            // SAFETY: a block the system allocator made for `layout`.
            (false, false) => unsafe { System.realloc(ptr, layout, new_size) },
            (true, true) => {
                // SAFETY: moves or resizes the mapping `map` made; its pages keep their bytes.
                let at = unsafe {
                    libc::mremap(
                        ptr.cast(),
                        round_up(layout.size()),
                        round_up(new_size),
                        libc::MREMAP_MAYMOVE,
                    )
                };
                match at {
                    libc::MAP_FAILED => std::ptr::null_mut(),
                    at => at.cast(),
                }
            }
            // Across the threshold: a new block, the bytes that fit copied, the old one freed.
            _ => {
                // SAFETY: a valid layout of non-zero size (one side is at least 1 MiB, and
                // `new_size` is not zero on the side below it: the trait forbids it).
                let fresh = unsafe { self.alloc(new) };
                if !fresh.is_null() {
                    // SAFETY: both blocks hold at least the bytes copied, and do not overlap;
                    // the old one is freed once, with its own layout.
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, fresh, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                fresh
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_zeroed_grow_shrink_and_keep_their_bytes() {
        let a = LargeMapped;
        for (from, to) in [
            (100, 2 << 20),
            (2 << 20, 100),
            (2 << 20, 5 << 20),
            (5 << 20, 3 << 20),
        ] {
            let layout = Layout::from_size_align(from, 8).unwrap();
            // SAFETY: each block is used within its size and freed once with its layout.
            unsafe {
                let p = a.alloc_zeroed(layout);
                assert!(!p.is_null());
                let bytes = std::slice::from_raw_parts_mut(p, from);
                assert!(bytes.iter().all(|b| *b == 0));
                for (i, b) in bytes.iter_mut().enumerate() {
                    *b = (i % 251) as u8;
                }
                let q = a.realloc(p, layout, to);
                assert!(!q.is_null());
                let kept = std::slice::from_raw_parts(q, from.min(to));
                assert!(kept.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
                a.dealloc(q, Layout::from_size_align(to, 8).unwrap());
            }
        }
    }
}
