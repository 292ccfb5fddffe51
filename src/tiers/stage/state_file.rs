//! The progress file of one staged image: which chunks of the local copy are complete, and the
//! xxh3 of each, so a restarted daemon resumes and checks what an earlier one wrote.
//!
//! Layout: a 64-byte header naming the chunk size and the source's fingerprint, then one 16-byte
//! record per chunk, `[xxh3 u64][PRESENT u64]`, little-endian. A record is written after its chunk's
//! bytes and never fsynced: a crash can leave a record whose bytes did not reach the disk, and the
//! checksum test before serving catches exactly that.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::source::Fingerprint;
use crate::util::le::u64_at;

const MAGIC: &[u8; 8] = b"PKFSSTG\x01";
const HEADER: u64 = 64;
const RECORD: u64 = 16;
/// Marks a complete chunk; any other value (zeros of a fresh file, a torn write) means absent.
const PRESENT: u64 = u64::from_le_bytes(*b"present!");

pub struct StateFile {
    file: File,
    path: PathBuf,
}

/// What an opened progress file holds.
pub struct Loaded {
    pub state: StateFile,
    /// The recorded checksum of each complete chunk.
    pub sums: Vec<Option<u64>>,
    /// Why an existing file was started over (the source changed, another chunk size), if it was.
    pub reset: Option<String>,
}

fn header(chunk: u64, fp: &Fingerprint) -> [u8; HEADER as usize] {
    let mut h = [0u8; HEADER as usize];
    h[0..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&chunk.to_le_bytes());
    h[16..24].copy_from_slice(&fp.size.to_le_bytes());
    h[24..32].copy_from_slice(&fp.mtime.to_le_bytes());
    h[32..36].copy_from_slice(&fp.mtime_nsec.to_le_bytes());
    h[40..48].copy_from_slice(&fp.head.to_le_bytes());
    h[48..56].copy_from_slice(&fp.tail.to_le_bytes());
    h
}

/// Why a header does not describe this source and chunk size, in words.
fn mismatch(old: &[u8], want: &[u8], chunk: u64) -> Option<String> {
    if old.len() < HEADER as usize || &old[0..8] != MAGIC {
        return Some("its progress file is not one packfs wrote".into());
    }
    if u64_at(old, 8) != chunk {
        return Some(format!(
            "it was staged in chunks of {} bytes, this run uses {chunk}",
            u64_at(old, 8)
        ));
    }
    (old[16..HEADER as usize] != want[16..HEADER as usize])
        .then(|| "the source image changed since it was staged (fingerprint)".into())
}

impl StateFile {
    /// Opens or creates the progress file for `chunks` chunks of `chunk` bytes of the image with
    /// fingerprint `fp`; a file written for another source or chunk size is started over.
    pub fn open(path: &Path, chunk: u64, fp: &Fingerprint, chunks: usize) -> io::Result<Loaded> {
        let mut file = crate::util::safe_file::open_owned(path)?;
        let want = header(chunk, fp);
        let len = HEADER + RECORD * chunks as u64;
        let old = read_all(&mut file)?;
        let reset = if old.is_empty() {
            None
        } else if let Some(why) = mismatch(&old, &want, chunk) {
            Some(why)
        } else if old.len() as u64 != len {
            Some(format!(
                "its progress file has {} bytes, {len} expected",
                old.len()
            ))
        } else {
            let sums = old[HEADER as usize..]
                .chunks_exact(RECORD as usize)
                .map(|r| (u64_at(r, 8) == PRESENT).then(|| u64_at(r, 0)))
                .collect();
            let state = StateFile {
                file,
                path: path.to_path_buf(),
            };
            return Ok(Loaded {
                state,
                sums,
                reset: None,
            });
        };
        file.set_len(0)?;
        file.write_all_at(&want, 0)?;
        file.set_len(len)?;
        Ok(Loaded {
            state: StateFile {
                file,
                path: path.to_path_buf(),
            },
            sums: vec![None; chunks],
            reset,
        })
    }

    /// Records chunk `i` as complete with checksum `sum`.
    pub fn mark(&self, i: usize, sum: u64) -> io::Result<()> {
        let mut r = [0u8; RECORD as usize];
        r[0..8].copy_from_slice(&sum.to_le_bytes());
        r[8..16].copy_from_slice(&PRESENT.to_le_bytes());
        self.file.write_all_at(&r, HEADER + RECORD * i as u64)
    }

    /// Records chunk `i` as absent.
    pub fn clear(&self, i: usize) -> io::Result<()> {
        self.file
            .write_all_at(&[0u8; RECORD as usize], HEADER + RECORD * i as u64)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn read_all(file: &mut File) -> io::Result<Vec<u8>> {
    use std::io::{Read, Seek};
    let mut old = Vec::new();
    file.seek(io::SeekFrom::Start(0))?;
    file.read_to_end(&mut old)?;
    Ok(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(size: u64, mtime: i64) -> Fingerprint {
        Fingerprint {
            size,
            mtime,
            mtime_nsec: 5,
            head: 11,
            tail: 12,
        }
    }

    #[test]
    fn progress_survives_a_reopen_and_resets_when_the_source_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.state");
        let first = StateFile::open(&path, 1 << 20, &fp(3 << 20, 1), 3).unwrap();
        assert!(first.reset.is_none());
        assert_eq!(first.sums, vec![None; 3]);
        first.state.mark(0, 0xfeed).unwrap();
        first.state.mark(2, 0).unwrap();
        first.state.mark(1, 7).unwrap();
        first.state.clear(1).unwrap();
        drop(first);

        let again = StateFile::open(&path, 1 << 20, &fp(3 << 20, 1), 3).unwrap();
        assert!(again.reset.is_none());
        assert_eq!(again.sums, vec![Some(0xfeed), None, Some(0)]);
        drop(again);

        let changed = StateFile::open(&path, 1 << 20, &fp(3 << 20, 2), 3).unwrap();
        assert!(
            changed
                .reset
                .as_ref()
                .unwrap()
                .contains("source image changed")
        );
        assert_eq!(changed.sums, vec![None; 3]);
        drop(changed);

        let rechunked = StateFile::open(&path, 1 << 19, &fp(3 << 20, 2), 6).unwrap();
        assert!(rechunked.reset.unwrap().contains("chunks of 1048576"));

        std::fs::write(&path, b"garbage").unwrap();
        let garbage = StateFile::open(&path, 1 << 19, &fp(3 << 20, 2), 6).unwrap();
        assert!(garbage.reset.unwrap().contains("not one packfs wrote"));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 + 16 * 6);
    }
}
