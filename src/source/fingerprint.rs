//! Image fingerprints: cheap evidence that an image is still the one an index describes.
//!
//! Size and mtime catch ordinary rewrites; hashes of the first and last 64 KiB catch a file replaced
//! by another of the same size (a re-packed shard) even when its mtime was preserved. Computing one
//! costs a stat and two reads, whatever the image size.

use std::fs::File;
use std::os::unix::fs::MetadataExt;

use xxhash_rust::xxh3::xxh3_64;

use crate::source::read_at::{ReadAt, Stamp};

/// Bytes hashed at each end of an image.
pub const EDGE: u64 = 64 * 1024;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fingerprint {
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// xxh3 of the first `min(EDGE, size)` bytes.
    pub head: u64,
    /// xxh3 of the last `min(EDGE, size)` bytes.
    pub tail: u64,
}

impl Fingerprint {
    pub fn of(file: &File) -> std::io::Result<Fingerprint> {
        let meta = file.metadata()?;
        Fingerprint::of_read_at(file, meta.len(), meta.mtime(), meta.mtime_nsec() as u32)
    }

    /// The fingerprint of `size` bytes readable through `data` (a file or an object), modified at
    /// `mtime`: the ends are read and hashed.
    pub fn of_read_at(
        data: &dyn ReadAt,
        size: u64,
        mtime: i64,
        mtime_nsec: u32,
    ) -> std::io::Result<Fingerprint> {
        let edge = EDGE.min(size);
        let mut buf = vec![0u8; edge as usize];
        data.read_exact_at(&mut buf, 0)?;
        let head = xxh3_64(&buf);
        data.read_exact_at(&mut buf, size - edge)?;
        let tail = xxh3_64(&buf);
        Ok(Fingerprint {
            size,
            mtime,
            mtime_nsec,
            head,
            tail,
        })
    }

    /// What differs between the recorded fingerprint (`self`) and the current one, in words; `None`
    /// when they match.
    pub fn differences(&self, now: &Fingerprint) -> Option<String> {
        let mut what = stamp_differences(self.stamp(), now.stamp());
        if self.head != now.head {
            what.push("its first 64 KiB differ".into());
        }
        if self.tail != now.tail {
            what.push("its last 64 KiB differ".into());
        }
        (!what.is_empty()).then(|| what.join(", "))
    }
}

impl Fingerprint {
    /// The part a stat shows.
    pub fn stamp(&self) -> Stamp {
        Stamp {
            size: self.size,
            mtime: self.mtime,
            mtime_nsec: self.mtime_nsec,
        }
    }
}

/// What differs between two stats of an image, in words ("size was A bytes, is B", "mtime was
/// X, is Y").
pub fn stamp_differences(was: Stamp, now: Stamp) -> Vec<String> {
    let mut what = Vec::new();
    if was.size != now.size {
        what.push(format!("size was {} bytes, is {}", was.size, now.size));
    }
    if !was.same_time(&now) {
        what.push(format!(
            "mtime was {}, is {}",
            show_time(was.mtime, was.mtime_nsec),
            show_time(now.mtime, now.mtime_nsec)
        ));
    }
    what
}

/// `@SECONDS.NANOS`, the form `touch -d` and `date -d` accept.
pub fn show_time(secs: i64, nsec: u32) -> String {
    format!("@{secs}.{nsec:09}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    /// A copy that kept its time on a file system of whole seconds (MooseFS): the same second,
    /// no nanoseconds, is the time indexed; another second, or other nanoseconds, is not.
    #[test]
    fn whole_seconds_match_the_time_indexed_with_nanoseconds() {
        let indexed = Stamp {
            size: 10,
            mtime: 1_700_000_000,
            mtime_nsec: 123_456_789,
        };
        let copied = Stamp {
            mtime_nsec: 0,
            ..indexed
        };
        assert!(indexed.matches(&copied));
        assert!(stamp_differences(indexed, copied).is_empty());
        for other in [
            Stamp {
                mtime: indexed.mtime + 1,
                ..copied
            },
            Stamp {
                mtime_nsec: 5,
                ..indexed
            },
            Stamp { size: 11, ..copied },
        ] {
            assert!(!indexed.matches(&other), "{other:?}");
            assert!(!stamp_differences(indexed, other).is_empty());
        }
    }

    #[test]
    fn detects_changes_at_either_end_and_in_size() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; 300_000]).unwrap();
        let before = Fingerprint::of(f.as_file()).unwrap();
        assert_eq!(before.differences(&before), None);

        let mut later = before;
        later.mtime += 1;
        assert!(before.differences(&later).unwrap().contains("mtime was @"));

        // Same size, last byte changed.
        f.as_file().write_all_at(b"x", 299_999).unwrap();
        let now = Fingerprint::of(f.as_file()).unwrap();
        let msg = before.differences(&now).unwrap();
        assert!(
            msg.contains("last 64 KiB") && !msg.contains("first"),
            "{msg}"
        );

        // Tiny file: head and tail cover the same bytes.
        let small = tempfile::NamedTempFile::new().unwrap();
        small.as_file().write_all_at(b"abc", 0).unwrap();
        let fp = Fingerprint::of(small.as_file()).unwrap();
        assert_eq!((fp.size, fp.head), (3, fp.tail));
    }
}
