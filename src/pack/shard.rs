//! Writing one shard: members read in parallel batches ahead of a writer that appends headers and
//! data in large sequential writes to a temporary file, renamed to the shard's name only once
//! complete and on disk; and checking a complete shard kept by `--resume`.

use std::io::Write;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rayon::prelude::*;

use super::PackError;
use super::compress::{Compression, FramedOut};
use super::gather::{Item, ItemKind, Sources};
use super::tar_writer;
use crate::archive::placement::crc_record;
use crate::archive::{Encoding, Member, MemberKind, ScannedImage};
use crate::source::Fingerprint;
use crate::source::ImageLocation;

/// Members read at once, ahead of the writer: at most this many bytes or members per batch.
const BATCH_BYTES: u64 = 8 << 20;
const BATCH_MEMBERS: usize = 2048;
/// A member larger than this is streamed through the writer in pieces of this size.
const STREAM_PIECE: u64 = 8 << 20;

/// One shard to write: its final path and its members (indices into the item table), in order.
#[derive(Debug)]
pub struct ShardPlan {
    pub path: PathBuf,
    pub members: Vec<u32>,
    pub samples: u64,
}

/// Work done so far, across all shards.
#[derive(Default)]
pub struct Done {
    pub members: AtomicU64,
    pub bytes: AtomicU64,
}

/// What writing a shard needs besides its plan.
pub struct Writer<'a> {
    pub items: &'a [Item],
    pub sources: &'a Sources,
    pub pool: &'a rayon::ThreadPool,
    pub done: &'a Done,
    /// Set when another shard failed: stop early.
    pub abort: &'a AtomicBool,
    /// Replace an existing shard of the same name.
    pub force: bool,
    /// Sync each shard to disk before renaming it.
    pub sync: bool,
    /// Write `.tar.zst` shards in frames (`compress`), or plain tars.
    pub compress: Option<Compression>,
}

/// Where a shard's tar bytes go: the file as they are, or frames of zstd.
enum Out<'a> {
    Plain(&'a std::fs::File),
    Framed(FramedOut<'a>),
}

impl Out<'_> {
    /// A member of `len` bytes follows (a frame may be cut before it).
    fn begin_member(&mut self, len: u64) -> std::io::Result<()> {
        match self {
            Out::Plain(_) => Ok(()),
            Out::Framed(f) => f.begin_member(len),
        }
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Out::Plain(file) => (*file).write_all(bytes),
            Out::Framed(f) => f.write(bytes),
        }
    }

    /// Whole members laid out in `bytes`, starting at the given offsets.
    fn write_members(&mut self, bytes: &[u8], starts: &[u64]) -> std::io::Result<()> {
        if let Out::Plain(_) = self {
            return self.write(bytes);
        }
        for (k, &start) in starts.iter().enumerate() {
            let end = starts.get(k + 1).map_or(bytes.len(), |&e| e as usize);
            self.begin_member(end as u64 - start)?;
            self.write(&bytes[start as usize..end])?;
        }
        Ok(())
    }
}

enum Batch {
    /// Small members laid out in `buf[..used]` as they go into the shard: headers, data read in
    /// place, padding. `members`: (item, header and data offsets in the batch, CRC-32).
    Filled {
        buf: Vec<u8>,
        used: usize,
        members: Vec<(u32, u64, u64, u32)>,
    },
    /// One large member, streamed by the writer.
    Stream(u32),
}

impl Writer<'_> {
    /// Writes the shard of `plan`; the members as packfs will index them.
    pub fn write(&self, plan: &ShardPlan) -> Result<ScannedImage, PackError> {
        let dir = plan.path.parent().expect("shards are in a directory");
        let file_name = plan.path.file_name().expect("a shard has a name");
        let io_err = |error| PackError::Write {
            path: plan.path.clone(),
            error,
        };
        // A name no reader takes for a shard: hidden, and `.partial` at the end.
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{}.", file_name.to_string_lossy()))
            .suffix(".partial")
            .tempfile_in(dir)
            .map_err(io_err)?;
        let mut out = match self.compress {
            None => Out::Plain(tmp.as_file()),
            Some(how) => Out::Framed(FramedOut::new(tmp.as_file(), how, self.pool)),
        };
        let batches = self.batches(&plan.members);
        let mut offset = 0u64;
        let mut members: Vec<(u32, u64, u64, u32)> = Vec::with_capacity(plan.members.len());
        let (send, receive) = crossbeam_channel::bounded::<Result<Batch, PackError>>(2);
        // Written buffers go back to the reader: no allocation (or zeroing) per batch.
        let (give_back, reuse) = crossbeam_channel::unbounded::<Vec<u8>>();
        std::thread::scope(|scope| -> Result<(), PackError> {
            scope.spawn(|| {
                for batch in &batches {
                    if self.abort.load(Ordering::Relaxed) {
                        break;
                    }
                    let buf = reuse.try_recv().unwrap_or_default();
                    let read = self.read_batch(batch, buf);
                    let failed = read.is_err();
                    if send.send(read).is_err() || failed {
                        break;
                    }
                }
                drop(send);
            });
            let result = (|| {
                for batch in receive.iter() {
                    if self.abort.load(Ordering::Relaxed) {
                        return Err(PackError::Aborted);
                    }
                    match batch? {
                        Batch::Filled {
                            buf,
                            used,
                            members: read,
                        } => {
                            let starts: Vec<u64> = read.iter().map(|m| m.1).collect();
                            out.write_members(&buf[..used], &starts).map_err(io_err)?;
                            for (i, header_at, data_at, crc) in read {
                                members.push((i, offset + header_at, offset + data_at, crc));
                                self.count(&self.items[i as usize]);
                            }
                            offset += used as u64;
                            let _ = give_back.send(buf);
                        }
                        Batch::Stream(i) => {
                            let item = &self.items[i as usize];
                            let mut piece = Vec::with_capacity(STREAM_PIECE as usize);
                            self.header(&mut piece, item)?;
                            let header_at = offset;
                            let data_at = offset + piece.len() as u64;
                            let file = self.sources.open(item)?;
                            let len =
                                piece.len() as u64 + item.size + tar_writer::padding(item.size);
                            out.begin_member(len).map_err(io_err)?;
                            let mut crc = crc32fast::Hasher::new();
                            let mut at = 0u64;
                            while at < item.size {
                                let n = (item.size - at).min(STREAM_PIECE) as usize;
                                let before = piece.len();
                                file.read(item, at, n, &mut piece)?;
                                crc.update(&piece[before..]);
                                at += n as u64;
                                if at == item.size {
                                    tar_writer::pad(&mut piece, item.size);
                                }
                                out.write(&piece).map_err(io_err)?;
                                offset += piece.len() as u64;
                                piece.clear();
                            }
                            members.push((i, header_at, data_at, crc.finalize()));
                            self.count(item);
                        }
                    }
                }
                Ok(())
            })();
            if result.is_err() {
                // Unblock the reader, which may wait to send.
                self.abort.store(true, Ordering::Relaxed);
                while receive.try_recv().is_ok() {}
            }
            drop(receive);
            result
        })?;
        if members.len() != plan.members.len() {
            return Err(PackError::Aborted);
        }
        let frames = match out {
            Out::Plain(mut file) => {
                file.write_all(&tar_writer::END).map_err(io_err)?;
                None
            }
            Out::Framed(f) => Some(f.finish(&tar_writer::END).map_err(io_err)?),
        };
        let file = tmp.as_file();
        file.set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(io_err)?;
        // Renamed once complete: a process killed mid-way leaves only the temporary file. Synced
        // first only when asked: a sync waits for the disk (tar and webdataset's ShardWriter do
        // not sync either); without it a crash of the node may leave a shard unwritten under its
        // name, which `--resume` finds (it reads every kept shard) and refuses.
        if self.sync {
            file.sync_all().map_err(io_err)?;
        }
        let file = if self.force {
            tmp.persist(&plan.path)
        } else {
            tmp.persist_noclobber(&plan.path)
        }
        .map_err(|e| io_err(e.error))?;
        let fingerprint = Fingerprint::of(&file).map_err(io_err)?;
        let mut image = ScannedImage::new(ImageLocation::File(plan.path.clone()), fingerprint);
        // In a compressed shard, offsets are in the decoded tar and each frame checks itself.
        let compressed = frames.is_some();
        for (i, header_at, data_at, crc) in members {
            let crc = (!compressed).then_some(crc);
            push_member(&mut image, &self.items[i as usize], header_at, data_at, crc);
        }
        if let Some((frames, total)) = frames {
            crate::archive::framed::attach(&mut image, total, &frames).map_err(io_err)?;
        }
        Ok(image)
    }

    /// Checks that the complete shard at `plan.path` holds exactly the planned members, and
    /// reads their data once for the CRC-32s the index records (`--resume`).
    pub fn check_existing(&self, plan: &ShardPlan) -> Result<ScannedImage, PackError> {
        let differs = |why: String| PackError::ShardDiffers {
            path: plan.path.clone(),
            why,
        };
        // A file: no store is reached.
        let stores = crate::source::Stores::default();
        let scanned = crate::dataset::scan_image(&ImageLocation::File(plan.path.clone()), &stores)
            .map_err(|e| differs(e.to_string()))?;
        if scanned.members.len() != plan.members.len() {
            return Err(differs(format!(
                "it has {} members, this pack plans {}",
                scanned.members.len(),
                plan.members.len()
            )));
        }
        if self.compress.is_some() {
            // The scan decoded every frame against its checksum: the members are as planned
            // (checked below) and the scan's catalog, frames included, is the index's.
            for (m, &i) in scanned.members.iter().zip(&plan.members) {
                self.same_member(&scanned, m, &self.items[i as usize], plan)?;
                self.count(&self.items[i as usize]);
            }
            return Ok(scanned);
        }
        let file =
            crate::source::read_at::open_regular(&plan.path).map_err(|error| PackError::Read {
                path: plan.path.clone(),
                error,
            })?;
        let mut image =
            ScannedImage::new(ImageLocation::File(plan.path.clone()), scanned.fingerprint);
        let mut data = Vec::new();
        for (m, &i) in scanned.members.iter().zip(&plan.members) {
            let item = &self.items[i as usize];
            let kind = self.same_member(&scanned, m, item, plan)?;
            let mut crc = 0;
            if kind == ItemKind::File {
                let mut hasher = crc32fast::Hasher::new();
                let mut at = 0;
                while at < m.size {
                    let n = (m.size - at).min(STREAM_PIECE) as usize;
                    data.resize(n, 0);
                    file.read_exact_at(&mut data, m.data_offset + at)
                        .map_err(|error| PackError::Read {
                            path: plan.path.clone(),
                            error,
                        })?;
                    hasher.update(&data);
                    at += n as u64;
                }
                crc = hasher.finalize();
            }
            push_member(&mut image, item, m.header_offset, m.data_offset, Some(crc));
            self.count(item);
        }
        Ok(image)
    }

    /// Checks that member `m` of a kept shard is the planned `item`; its kind.
    fn same_member(
        &self,
        scanned: &ScannedImage,
        m: &Member,
        item: &Item,
        plan: &ShardPlan,
    ) -> Result<ItemKind, PackError> {
        let kind = match m.kind {
            MemberKind::File | MemberKind::HardLink => ItemKind::File,
            MemberKind::Dir => ItemKind::Dir,
            MemberKind::Symlink => ItemKind::Symlink,
        };
        let same = scanned.path_of(m) == &item.path[..]
            && kind == item.kind
            && m.size == item.size
            && m.mode == item.mode
            && m.mtime == item.mtime
            && (kind != ItemKind::Symlink || scanned.link_of(m) == &item.link[..]);
        if !same {
            return Err(PackError::ShardDiffers {
                path: plan.path.clone(),
                why: format!(
                    "member {:?} at byte offset {} is not the planned {:?}",
                    String::from_utf8_lossy(scanned.path_of(m)),
                    m.header_offset,
                    String::from_utf8_lossy(&item.path)
                ),
            });
        }
        Ok(kind)
    }

    fn count(&self, item: &Item) {
        self.done.members.fetch_add(1, Ordering::Relaxed);
        self.done.bytes.fetch_add(item.size, Ordering::Relaxed);
    }

    fn header(&self, out: &mut Vec<u8>, item: &Item) -> Result<(), PackError> {
        let kind = item.header_kind();
        tar_writer::append_header(out, &item.path, kind, item.mode, item.mtime).map_err(|e| {
            PackError::Source(format!(
                "cannot write a tar header for {:?}: {e}",
                String::from_utf8_lossy(&item.path)
            ))
        })
    }

    /// Cuts a shard's members into batches: runs of small members, and large ones alone.
    fn batches(&self, members: &[u32]) -> Vec<Vec<u32>> {
        let mut batches = Vec::new();
        let mut current = Vec::new();
        let mut bytes = 0;
        for &i in members {
            let size = self.items[i as usize].size;
            if size > STREAM_PIECE {
                if !current.is_empty() {
                    batches.push(std::mem::take(&mut current));
                    bytes = 0;
                }
                batches.push(vec![i]);
                continue;
            }
            if !current.is_empty() && (bytes + size > BATCH_BYTES || current.len() >= BATCH_MEMBERS)
            {
                batches.push(std::mem::take(&mut current));
                bytes = 0;
            }
            current.push(i);
            bytes += size;
        }
        if !current.is_empty() {
            batches.push(current);
        }
        batches
    }

    /// Lays a batch out in `buf` as it goes into the shard and reads its members' data into
    /// place in parallel, with their CRC-32s (a large member is left to the writer).
    fn read_batch(&self, batch: &[u32], mut buf: Vec<u8>) -> Result<Batch, PackError> {
        if let [one] = batch
            && self.items[*one as usize].size > STREAM_PIECE
        {
            return Ok(Batch::Stream(*one));
        }
        // Headers first, to know where everything goes.
        let mut heads = Vec::with_capacity(batch.len() * 512);
        let mut spans = Vec::with_capacity(batch.len());
        let mut used = 0usize;
        for &i in batch {
            let start = heads.len();
            self.header(&mut heads, &self.items[i as usize])?;
            let head = heads.len() - start;
            let size = self.items[i as usize].size;
            spans.push((start, head, used));
            used += head + (size + tar_writer::padding(size)) as usize;
        }
        // The buffer only grows: data regions are overwritten by the reads, padding zeroed here.
        if buf.len() < used {
            buf.resize(used, 0);
        }
        let mut slices = Vec::with_capacity(batch.len());
        let mut rest = &mut buf[..used];
        for (&i, &(start, head, _)) in batch.iter().zip(&spans) {
            let size = self.items[i as usize].size as usize;
            let (h, r) = rest.split_at_mut(head);
            h.copy_from_slice(&heads[start..start + head]);
            let (data, r) = r.split_at_mut(size);
            let (pad, r) = r.split_at_mut(tar_writer::padding(size as u64) as usize);
            pad.fill(0);
            slices.push((i, data));
            rest = r;
        }
        let crcs: Result<Vec<u32>, PackError> = self.pool.install(|| {
            slices
                .par_iter_mut()
                .map(|(i, data)| {
                    let item = &self.items[*i as usize];
                    if item.kind == ItemKind::File && !data.is_empty() {
                        self.sources.open(item)?.read_into(item, 0, data)?;
                    }
                    Ok(crc32fast::hash(data))
                })
                .collect()
        });
        let members = batch
            .iter()
            .zip(&spans)
            .zip(crcs?)
            .map(|((&i, &(_, head, at)), crc)| (i, at as u64, (at + head) as u64, crc))
            .collect();
        Ok(Batch::Filled { buf, used, members })
    }
}

/// Records a written member as a scan of the shard would find it, with its CRC-32 (none in a
/// compressed shard, whose frames carry checksums).
fn push_member(
    image: &mut ScannedImage,
    item: &Item,
    header_at: u64,
    data_at: u64,
    crc: Option<u32>,
) {
    let path = image.push_string(&item.path);
    let (kind, link, encoding) = match (item.kind, crc) {
        (ItemKind::File, Some(crc)) => (
            MemberKind::File,
            image.push_string(&crc_record(data_at, crc)),
            Encoding::StoredCrc,
        ),
        (ItemKind::File, None) => (MemberKind::File, Default::default(), Encoding::Stored),
        (ItemKind::Dir, _) => (MemberKind::Dir, Default::default(), Encoding::Stored),
        (ItemKind::Symlink, _) => (
            MemberKind::Symlink,
            image.push_string(&item.link),
            Encoding::Stored,
        ),
    };
    image.members.push(Member {
        path,
        link,
        kind,
        mode: item.mode,
        mtime: item.mtime,
        mtime_nsec: 0,
        size: item.size,
        data_offset: data_at,
        encoding,
        header_offset: header_at,
    });
}

/// The shard files of a pack named `name` in `dir` beyond the first `count` (left by an earlier
/// pack with more shards).
pub fn extra_shards(dir: &Path, name: &str, count: usize) -> Vec<PathBuf> {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut extra: Vec<PathBuf> = listing
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let file = e.file_name().into_string().ok()?;
            let number = file
                .strip_prefix(name)?
                .strip_prefix('-')?
                .strip_suffix(".tar.zst")
                .or_else(|| {
                    file.strip_prefix(name)?
                        .strip_prefix('-')?
                        .strip_suffix(".tar")
                })?;
            let n: usize = number.parse().ok()?;
            (number.len() == 6 && n >= count).then(|| e.path())
        })
        .collect();
    extra.sort();
    extra
}

/// Removes the temporary files of an interrupted pack of `name` in `dir`.
pub fn remove_partials(dir: &Path, name: &str) -> usize {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return 0;
    };
    let prefix = format!(".{name}-");
    listing
        .filter_map(|e| e.ok())
        .filter(|e| {
            let file = e.file_name();
            let file = file.to_string_lossy();
            file.starts_with(&prefix)
                && file.ends_with(".partial")
                && e.file_type().is_ok_and(|t| t.is_file())
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}
