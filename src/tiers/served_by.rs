//! Which tiers served the reads of this thread since it last asked: a thread-local bit set,
//! marked where bytes come from (source, RAM cache, stage) and taken by the I/O trace after each
//! read. A plain `Cell` store per marked read; nothing else reads it.

use std::cell::Cell;

pub const SOURCE: u8 = 1;
pub const RAM: u8 = 2;
pub const STAGE: u8 = 4;

thread_local! {
    static MARKS: Cell<u8> = const { Cell::new(0) };
}

pub fn mark(tier: u8) {
    MARKS.with(|m| m.set(m.get() | tier));
}

/// The tiers marked since the last call, and clears them.
pub fn take() -> u8 {
    MARKS.with(|m| m.replace(0))
}

/// The names of the tiers in `marks`, `+`-joined (`ram+source`); `none` for a read that needed
/// no bytes (past the end of a file, or an empty one).
pub fn names(marks: u8) -> &'static str {
    match marks & 7 {
        0 => "none",
        SOURCE => "source",
        RAM => "ram",
        STAGE => "stage",
        3 => "ram+source",
        5 => "stage+source",
        6 => "stage+ram",
        _ => "stage+ram+source",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_accumulate_until_taken() {
        take();
        mark(RAM);
        mark(SOURCE);
        assert_eq!(names(take()), "ram+source");
        assert_eq!(take(), 0);
        mark(STAGE);
        assert_eq!(names(take()), "stage");
    }
}
