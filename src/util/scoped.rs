//! A thread-local value set for the length of a call: what a FUSE request thread tells the layers
//! below it about the request it serves (may it wait, whose it is) without threading an argument
//! through every read.

use std::cell::Cell;
use std::thread::LocalKey;

/// Runs `f` with `key` set to `value`, then puts the previous value back (also when `f` panics).
pub fn with<V: Copy + 'static, T>(
    key: &'static LocalKey<Cell<V>>,
    value: V,
    f: impl FnOnce() -> T,
) -> T {
    struct Restore<V: Copy + 'static>(&'static LocalKey<Cell<V>>, V);
    impl<V: Copy + 'static> Drop for Restore<V> {
        fn drop(&mut self) {
            self.0.set(self.1);
        }
    }
    let _restore = Restore(key, key.replace(value));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static V: Cell<u32> = const { Cell::new(1) };
    }

    #[test]
    fn the_value_holds_inside_and_is_restored_after_even_a_panic() {
        assert_eq!(with(&V, 2, || with(&V, 3, || V.get()) * 10 + V.get()), 32);
        assert_eq!(V.get(), 1);
        let caught = std::panic::catch_unwind(|| with(&V, 4, || panic!("inside")));
        assert!(caught.is_err());
        assert_eq!(V.get(), 1);
    }
}
