//! Inflating a whole stream once, at scan time, handing out its bytes in order and noting
//! restart checkpoints on the way.

use std::io;

use miniz_oxide::inflate::TINFLStatus;
use miniz_oxide::inflate::core::inflate_flags::{
    TINFL_FLAG_HAS_MORE_INPUT, TINFL_FLAG_STOP_ON_BLOCK_BOUNDARY,
    TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF,
};
use miniz_oxide::inflate::core::{DecompressorOxide, decompress};

use super::table::{self, Checkpoint};
use super::{MAX_INTERVAL, WINDOW, gzip};
use crate::archive::spill::{TableFile, TableRef, Windows};
use crate::source::read_at::ReadAt;
use crate::util::le;

/// Compressed bytes read at a time (sequential reads, large enough for a parallel filesystem).
const INPUT: usize = 1 << 20;
/// Decoded bytes handed out per `next_chunk` at most.
const OUTPUT: usize = 256 * 1024;

/// How the deflate data is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrapper {
    /// One raw deflate stream (a zip member).
    Raw,
    /// One or more gzip members, back to back (`gzip`, `pigz`, `cat a.gz b.gz`).
    Gzip,
}

#[derive(Debug, thiserror::Error)]
pub enum InflateError {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The data is not what its framing promises; `at` is the image offset near the problem.
    #[error("at byte offset {at}: {why}")]
    Bad { at: u64, why: String },
}

impl InflateError {
    /// Data that is not what its framing promises, at image offset `at`.
    pub fn bad(at: u64, why: impl Into<String>) -> InflateError {
        InflateError::Bad {
            at,
            why: why.into(),
        }
    }
}

/// What follows the last gzip member, when it is not the end of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trailing {
    pub at: u64,
    pub all_zero: bool,
}

pub struct Indexer<'r> {
    image: &'r dyn ReadAt,
    image_len: u64,
    wrapper: Wrapper,
    spacing: u64,
    input: Vec<u8>,
    in_start: usize,
    in_end: usize,
    /// Image offset of `input[in_start]`.
    in_pos: u64,
    decoder: Box<DecompressorOxide>,
    /// The current member's recent output (for windows), then the bytes being handed out.
    out: Vec<u8>,
    out_pos: usize,
    total: u64,
    /// Decoded bytes of the current gzip member (or of the whole raw stream).
    member_out: u64,
    member_crc: crc32fast::Hasher,
    /// CRC-32 of a raw stream (one member), kept when it ends.
    raw_crc: u32,
    interval_crc: crc32fast::Hasher,
    checkpoints: Vec<Checkpoint>,
    /// The windows found so far, on disk (32 KiB per checkpoint: never held in memory).
    windows: Windows,
    trailing: Option<Trailing>,
    done: bool,
}

impl<'r> Indexer<'r> {
    /// An indexer for the stream that starts at `start` of `image` (`image_len` bytes), with a
    /// checkpoint every `spacing` decoded bytes.
    pub fn new(
        image: &'r dyn ReadAt,
        image_len: u64,
        start: u64,
        wrapper: Wrapper,
        spacing: u64,
    ) -> Result<Indexer<'r>, InflateError> {
        let mut ix = Indexer {
            image,
            image_len,
            wrapper,
            spacing: spacing.max(WINDOW as u64),
            input: vec![0; INPUT],
            in_start: 0,
            in_end: 0,
            in_pos: start,
            decoder: Box::default(),
            out: vec![0; WINDOW + OUTPUT],
            out_pos: 0,
            total: 0,
            member_out: 0,
            member_crc: crc32fast::Hasher::new(),
            raw_crc: 0,
            interval_crc: crc32fast::Hasher::new(),
            checkpoints: Vec::new(),
            windows: Windows::new(),
            trailing: None,
            done: false,
        };
        if wrapper == Wrapper::Gzip {
            ix.gzip_header()?;
        }
        ix.checkpoint(0, 0, 0..0)?;
        Ok(ix)
    }

    fn bad(&self, why: impl Into<String>) -> InflateError {
        InflateError::bad(self.in_pos, why)
    }

    /// Makes at least `n` unread input bytes available (fewer only at the image's end).
    fn fill(&mut self, n: usize) -> Result<(), InflateError> {
        if self.in_end - self.in_start >= n {
            return Ok(());
        }
        self.input.copy_within(self.in_start..self.in_end, 0);
        self.in_end -= self.in_start;
        self.in_start = 0;
        while self.in_end < n.max(INPUT) {
            let at = self.in_pos + self.in_end as u64;
            let room = (self.image_len.saturating_sub(at)).min((INPUT - self.in_end) as u64);
            if room == 0 {
                break;
            }
            let got = self.image.read_at(
                &mut self.input[self.in_end..self.in_end + room as usize],
                at,
            )?;
            if got == 0 {
                break;
            }
            self.in_end += got;
        }
        Ok(())
    }

    /// The next `n` framing bytes (at most `INPUT`).
    fn take(&mut self, n: usize) -> Result<Vec<u8>, InflateError> {
        self.fill(n)?;
        if self.in_end - self.in_start < n {
            return Err(self.bad("the gzip data is cut short (truncated file?)"));
        }
        let bytes = self.input[self.in_start..self.in_start + n].to_vec();
        self.in_start += n;
        self.in_pos += n as u64;
        Ok(bytes)
    }

    fn gzip_header(&mut self) -> Result<(), InflateError> {
        let at = self.in_pos;
        let mut failure = None;
        let parsed = gzip::header(|n| {
            self.take(n).map_err(|e| {
                let why = e.to_string();
                failure = Some(e);
                why
            })
        });
        match (parsed, failure) {
            (Ok(_), _) => Ok(()),
            (Err(_), Some(e)) => Err(e),
            (Err(why), None) => Err(InflateError::Bad { at, why }),
        }
    }

    /// Notes a checkpoint at the current position; closes the previous interval.
    fn checkpoint(
        &mut self,
        bit_count: u8,
        bits: u8,
        window: std::ops::Range<usize>,
    ) -> Result<(), InflateError> {
        if let Some(last) = self.checkpoints.last_mut() {
            last.crc = std::mem::take(&mut self.interval_crc).finalize();
        }
        let start = self.windows.push(&self.out[window])?;
        self.checkpoints.push(Checkpoint {
            in_at: self.in_pos,
            out_at: self.total,
            bit_count,
            bits,
            window: start..self.windows.len(),
            crc: 0,
        });
        Ok(())
    }

    /// Decoded bytes so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The next decoded bytes, in order; empty once the stream has ended.
    pub fn next_chunk(&mut self) -> Result<&[u8], InflateError> {
        loop {
            if self.done {
                return Ok(&[]);
            }
            if self.out_pos == self.out.len() {
                // Keep the last 32 KiB as the history later blocks refer to.
                self.out.copy_within(self.out_pos - WINDOW..self.out_pos, 0);
                self.out_pos = WINDOW;
            }
            if self.in_start == self.in_end {
                self.fill(1)?;
            }
            let at_end = self.in_pos + (self.in_end - self.in_start) as u64 >= self.image_len;
            let mut flags =
                TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF | TINFL_FLAG_STOP_ON_BLOCK_BOUNDARY;
            if !at_end {
                flags |= TINFL_FLAG_HAS_MORE_INPUT;
            }
            let from = self.out_pos;
            let (status, consumed, produced) = decompress(
                &mut self.decoder,
                &self.input[self.in_start..self.in_end],
                &mut self.out,
                from,
                flags,
            );
            self.in_start += consumed;
            self.in_pos += consumed as u64;
            self.out_pos += produced;
            let fresh = from..self.out_pos;
            self.total += produced as u64;
            self.member_out += produced as u64;
            for h in [&mut self.member_crc, &mut self.interval_crc] {
                h.update(&self.out[fresh.clone()]);
            }
            let last_out = self.checkpoints.last().map_or(0, |c| c.out_at);
            if self.total - last_out > MAX_INTERVAL as u64 {
                return Err(self.bad(format!(
                    "a deflate block decodes to more than {} MiB: packfs cannot restart inside \
                     it, so it cannot serve this stream with bounded memory (re-compress it with \
                     gzip or zip)",
                    MAX_INTERVAL >> 20
                )));
            }
            match status {
                TINFLStatus::BlockBoundary => {
                    if self.total - last_out >= self.spacing {
                        let state = self
                            .decoder
                            .block_boundary_state()
                            .ok_or_else(|| self.bad("no state at a deflate block boundary"))?;
                        let history = (self.member_out.min(WINDOW as u64)) as usize;
                        self.checkpoint(
                            state.num_bits,
                            state.bit_buf,
                            self.out_pos - history..self.out_pos,
                        )?;
                    }
                }
                TINFLStatus::Done => self.end_member()?,
                TINFLStatus::NeedsMoreInput | TINFLStatus::HasMoreOutput => {}
                TINFLStatus::FailedCannotMakeProgress => {
                    return Err(self.bad("the deflate data is cut short (truncated file?)"));
                }
                other => {
                    return Err(self.bad(format!("corrupt deflate data ({other:?})")));
                }
            }
            if !fresh.is_empty() {
                return Ok(&self.out[fresh]);
            }
        }
    }

    /// After a member's deflate data: its gzip trailer, then the next member or the end.
    fn end_member(&mut self) -> Result<(), InflateError> {
        if self.wrapper == Wrapper::Raw {
            self.raw_crc = std::mem::take(&mut self.member_crc).finalize();
            self.done = true;
            return Ok(());
        }
        let trailer_at = self.in_pos;
        let trailer = self.take(8)?;
        let crc = le::u32_at(&trailer, 0);
        let size = le::u32_at(&trailer, 4);
        let got = std::mem::take(&mut self.member_crc).finalize();
        if crc != got || size != self.member_out as u32 {
            return Err(InflateError::Bad {
                at: trailer_at,
                why: format!(
                    "the gzip member ending here is damaged: its trailer records CRC-32 {crc:08x} \
                     and length {size} (mod 2^32), the data has {got:08x} and {} (gzip -t \
                     rejects it too)",
                    self.member_out
                ),
            });
        }
        self.fill(2)?;
        let rest = &self.input[self.in_start..self.in_end];
        if rest.is_empty() {
            self.done = true;
        } else if gzip::is_gzip(rest) {
            self.gzip_header()?;
            *self.decoder = DecompressorOxide::default();
            self.member_out = 0;
            // A new member starts with no history, so its restart point needs no window.
            self.out_pos = 0;
            match self.checkpoints.last_mut() {
                Some(last) if last.out_at == self.total => last.in_at = self.in_pos,
                _ => self.checkpoint(0, 0, 0..0)?,
            }
        } else {
            let zeros = self.all_zero_to_end()?;
            self.trailing = Some(Trailing {
                at: self.in_pos,
                all_zero: zeros,
            });
            self.done = true;
        }
        Ok(())
    }

    fn all_zero_to_end(&mut self) -> Result<bool, InflateError> {
        let mut at = self.in_pos;
        let mut buf = vec![0u8; INPUT];
        while at < self.image_len {
            let n = ((self.image_len - at) as usize).min(INPUT);
            self.image.read_exact_at(&mut buf[..n], at)?;
            if buf[..n].iter().any(|&b| b != 0) {
                return Ok(false);
            }
            at += n as u64;
        }
        Ok(true)
    }

    /// Inflates what is left, then appends the checkpoint table to `tables` and returns where it
    /// is, the CRC-32 of a raw stream's bytes (gzip members check their own), and what trails
    /// the last gzip member.
    pub fn finish(mut self, tables: &mut TableFile) -> Result<Finished, InflateError> {
        while !self.next_chunk()?.is_empty() {}
        if let Some(last) = self.checkpoints.last_mut() {
            last.crc = std::mem::take(&mut self.interval_crc).finalize();
        }
        let mut head = Vec::new();
        table::encode_head(self.total, &self.checkpoints, &mut head);
        let table = tables.append(&head, std::mem::take(&mut self.windows))?;
        Ok(Finished {
            table,
            total: self.total,
            checkpoints: self.checkpoints.len(),
            crc: self.raw_crc,
            end: self.in_pos,
            trailing: self.trailing,
        })
    }
}

/// A stream inflated to its end.
#[derive(Debug)]
pub struct Finished {
    /// Where the checkpoint table (`table` module's encoding) is in the image's table file.
    pub table: TableRef,
    pub total: u64,
    pub checkpoints: usize,
    /// CRC-32 of the decoded bytes of a raw stream (0 for gzip, whose members carry their own).
    pub crc: u32,
    /// Image offset just after the last member's data (raw) or trailer (gzip).
    pub end: u64,
    pub trailing: Option<Trailing>,
}

#[cfg(test)]
mod tests {
    use super::super::{Checkpoints, Restart, inflate_interval};
    use super::*;
    use crate::archive::plan::Piece;
    use std::io::Write;

    /// Bytes that compress a little, in many deflate blocks.
    fn sample(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..len)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if i % 7 < 3 {
                    (x >> 60) as u8
                } else {
                    b"abcdefgh"[(x >> 61) as usize]
                }
            })
            .collect()
    }

    fn read_all(image: &[u8], table: &[u8]) -> Vec<u8> {
        let t = Checkpoints::from_bytes(table).unwrap();
        let mut out = Vec::new();
        while (out.len() as u64) < t.total() {
            let Piece::Decoded { unit, from, len } = t.piece(out.len() as u64, 1 << 30).unwrap()
            else {
                panic!("not decoded")
            };
            let bytes = unit.decode(&image.to_vec()).unwrap();
            out.extend_from_slice(&bytes[from..from + len]);
        }
        out
    }

    #[test]
    fn raw_stream_restarts_at_every_checkpoint() {
        let plain = sample(3 << 20, 1);
        let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(6));
        z.write_all(&plain).unwrap();
        let mut image = vec![9u8; 100];
        image.extend(z.finish().unwrap());
        let mut ix =
            Indexer::new(&image, image.len() as u64, 100, Wrapper::Raw, 256 << 10).unwrap();
        let mut streamed = Vec::new();
        loop {
            let chunk = ix.next_chunk().unwrap();
            if chunk.is_empty() {
                break;
            }
            streamed.extend_from_slice(chunk);
        }
        assert_eq!(streamed, plain);
        let mut tables = TableFile::new().unwrap();
        let done = ix.finish(&mut tables).unwrap();
        assert!(done.checkpoints >= 10, "{}", done.checkpoints);
        assert_eq!(done.crc, crc32fast::hash(&plain));
        assert_eq!(done.end, image.len() as u64);
        let table = tables.read(done.table).unwrap();
        assert_eq!(read_all(&image, &table), plain);
        // A flipped compressed byte is caught (by the decoder or by the interval's CRC-32).
        let t = Checkpoints::from_bytes(&table).unwrap();
        let mut damaged = image.clone();
        damaged[t.in_at(3) as usize + 50] ^= 0x10;
        let Piece::Decoded { unit, .. } = t.piece(t.out_at(3), 1).unwrap() else {
            panic!()
        };
        assert!(unit.decode(&damaged).is_err());
        assert!(
            inflate_interval(
                &image,
                t.in_at(1),
                &Restart {
                    in_len: None,
                    bit_count: 9,
                    bits: 0,
                    window: super::super::Located::Bytes(&[]),
                    len: 10,
                    crc: 0
                }
            )
            .is_err(),
            "bit counts over 7 are refused"
        );
    }

    #[test]
    fn gzip_members_back_to_back() {
        let parts = [sample(700_000, 2), Vec::new(), sample(300_000, 3)];
        let mut image = Vec::new();
        for p in &parts {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(1));
            gz.write_all(p).unwrap();
            image.extend(gz.finish().unwrap());
        }
        let plain = parts.concat();
        image.extend([0u8; 512]);
        let ix = Indexer::new(&image, image.len() as u64, 0, Wrapper::Gzip, 64 << 10).unwrap();
        let mut tables = TableFile::new().unwrap();
        let done = ix.finish(&mut tables).unwrap();
        assert_eq!(done.total, plain.len() as u64);
        let trailing = done.trailing.unwrap();
        assert!(trailing.all_zero);
        assert_eq!(trailing.at, image.len() as u64 - 512);
        assert_eq!(read_all(&image, &tables.read(done.table).unwrap()), plain);

        // A damaged trailer names its offset.
        let mut bad = image.clone();
        let end = trailing.at as usize;
        bad[end - 5] ^= 1;
        let err = Indexer::new(&bad, bad.len() as u64, 0, Wrapper::Gzip, 64 << 10)
            .unwrap()
            .finish(&mut TableFile::new().unwrap())
            .unwrap_err();
        assert!(
            err.to_string().contains(&format!("offset {}", end - 8)),
            "{err}"
        );
        // A cut one says so.
        let cut = image[..image.len() / 2].to_vec();
        let err = Indexer::new(&cut, cut.len() as u64, 0, Wrapper::Gzip, 64 << 10)
            .unwrap()
            .finish(&mut TableFile::new().unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("cut short"), "{err}");
    }
}
