//! Building the catalog from scanned images.
//!
//! All member paths are sorted once, component by component. In that order a directory comes right
//! before everything below it, so one pass with a stack of open directories creates the tree in
//! pre-order, synthesizes missing parents and sees duplicates as neighbours. A counting pass then
//! lays the children of every directory out contiguously.

use std::cmp::Ordering;
use std::path::PathBuf;

use tracing::debug;

use super::entry::{Entry, S_IFDIR, S_IFLNK, S_IFREG};
use super::store::{Segment, Store};
use super::{Catalog, ImageInfo};
use crate::archive::{Member, MemberKind, ScannedImage};
use crate::util::le;

/// What to do when two images hold the same path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DuplicatePolicy {
    /// Refuse to mount, naming both images.
    #[default]
    Error,
    /// The image given last wins.
    LastWins,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(
        "{path:?} is in two images: {} and {} (pass --duplicates last-wins to let the later one win)",
        first.display(), second.display()
    )]
    Duplicate {
        path: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error(
        "{path:?} is a file in {} but a directory in {}",
        file_image.display(), dir_image.display()
    )]
    FileIsDir {
        path: String,
        file_image: PathBuf,
        dir_image: PathBuf,
    },
    #[error("the catalog is too large: {0}")]
    TooLarge(&'static str),
    #[error("cannot map the checkpoint tables of {}: {error}", image.display())]
    Tables {
        image: PathBuf,
        error: std::io::Error,
    },
    /// A file and a directory of one image share a name; `ScannedImage::drop_clashes` settles it
    /// as extraction does, and the build is run again.
    #[error("{path:?} is a file and a directory in {}", image_path.display())]
    ClashInImage {
        image: usize,
        path: String,
        image_path: PathBuf,
    },
}

/// A member as referenced during the build: (image index, member index).
#[derive(Clone, Copy)]
struct Ref {
    image: u32,
    member: u32,
}

/// A node of the tree under construction, in pre-order.
struct Node<'a> {
    parent: u32,
    name: &'a [u8],
    /// The member behind the node; a synthesized directory borrows its mtime from the member that
    /// implied it and has `is_synth` set. Only the root of an empty catalog has none.
    src: Option<Ref>,
    is_synth: bool,
}

/// Orders paths component by component: `/` sorts below every other byte, so `a/b` < `a b`.
fn cmp_paths(a: &[u8], b: &[u8]) -> Ordering {
    match mismatch(a, b) {
        Some(i) => {
            let key = |c: u8| if c == b'/' { 0 } else { c };
            key(a[i]).cmp(&key(b[i]))
        }
        None => a.len().cmp(&b.len()),
    }
}

/// The first position where `a` and `b` differ, eight bytes at a time (sorting millions of paths
/// that share long prefixes is most of the build).
fn mismatch(a: &[u8], b: &[u8]) -> Option<usize> {
    let n = a.len().min(b.len());
    let word = |s: &[u8], i: usize| le::u64_at(s, i);
    let mut i = 0;
    while i + 8 <= n {
        let diff = word(a, i) ^ word(b, i);
        if diff != 0 {
            return Some(i + (diff.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    (i..n).find(|&j| a[j] != b[j])
}

/// Merges scanned images into one immutable catalog.
pub fn build(images: &[ScannedImage], policy: DuplicatePolicy) -> Result<Catalog, BuildError> {
    let member = |r: Ref| -> &Member { &images[r.image as usize].members[r.member as usize] };
    let path = |r: Ref| -> &[u8] { images[r.image as usize].path_of(member(r)) };
    let image_path = |r: Ref| images[r.image as usize].path.clone();
    let shown = |p: &[u8]| String::from_utf8_lossy(p).into_owned();

    // Each member with its path, so the sort compares without looking the path up.
    let mut refs: Vec<(&[u8], Ref)> = Vec::new();
    let mut root_attrs: Option<Ref> = None;
    for (i, image) in images.iter().enumerate() {
        for (j, m) in image.members.iter().enumerate() {
            let r = Ref {
                image: i as u32,
                member: j as u32,
            };
            if m.path.len == 0 {
                if m.kind == MemberKind::Dir {
                    root_attrs = Some(r);
                }
                continue;
            }
            refs.push((image.path_of(m), r));
        }
    }
    if refs.len() >= u32::MAX as usize - 1 {
        return Err(BuildError::TooLarge("more than 4 billion members"));
    }
    // A total order (equal paths by image, then by position in the image), so unstable is fine;
    // in parallel, as this sort is the largest serial step of an index build.
    use rayon::slice::ParallelSliceMut;
    refs.par_sort_unstable_by(|&(pa, a), &(pb, b)| {
        cmp_paths(pa, pb)
            .then(a.image.cmp(&b.image))
            .then(a.member.cmp(&b.member))
    });

    // Keep one member per path.
    let mut winners: Vec<Ref> = Vec::with_capacity(refs.len());
    for group in refs.chunk_by(|a, b| a.0 == b.0) {
        let last = group.last().expect("non-empty group").1;
        let first = group[0].1;
        // A name that is a file in one member and a directory in another of the same image may
        // have blocked members in between: extraction order decides (`drop_clashes`).
        // The group is sorted by image, so each image's members are one run: linear, however
        // many times a hostile archive names one path.
        let is_dir = |r: Ref| member(r).kind == MemberKind::Dir;
        let unsettled_mix = group
            .chunk_by(|x, y| x.1.image == y.1.image)
            .find(|run| {
                let first = run[0].1;
                !images[first.image as usize].clashes_settled
                    && run.iter().any(|&(_, r)| is_dir(r) != is_dir(first))
            })
            .map(|run| &run[0]);
        if let Some(&(_, a)) = unsettled_mix {
            return Err(BuildError::ClashInImage {
                image: a.image as usize,
                path: shown(path(a)),
                image_path: image_path(a),
            });
        }
        // A directory named twice keeps the attributes of the last (GNU tar sets them after
        // extracting), like any other member.
        let all_dirs = group
            .iter()
            .all(|&(_, r)| member(r).kind == MemberKind::Dir);
        if all_dirs {
            winners.push(last);
            continue;
        }
        if first.image != last.image && policy == DuplicatePolicy::Error {
            return Err(BuildError::Duplicate {
                path: shown(path(first)),
                first: image_path(first),
                second: image_path(last),
            });
        }
        if group.len() > 1 {
            debug!(path = %shown(path(last)), "duplicate path: the later member wins");
        }
        winners.push(last);
    }
    drop(refs);

    // Pre-order tree with synthesized parents.
    let root_src = root_attrs.or(winners.first().copied());
    let mut nodes: Vec<Node> = vec![Node {
        parent: 0,
        name: b"",
        src: root_src,
        is_synth: root_attrs.is_none(),
    }];
    // The nodes on the path to the last one placed, below the root: (node index, is_dir).
    let mut open: Vec<(u32, bool)> = Vec::new();
    let mut comps: Vec<&[u8]> = Vec::new();
    for &r in &winners {
        comps.clear();
        comps.extend(path(r).split(|&b| b == b'/'));
        let parents = comps.len() - 1;
        let mut depth = 0;
        while depth < open.len()
            && depth < parents
            && nodes[open[depth].0 as usize].name == comps[depth]
        {
            if !open[depth].1 {
                let file_src = nodes[open[depth].0 as usize].src.unwrap_or(r);
                if file_src.image == r.image && !images[r.image as usize].clashes_settled {
                    return Err(BuildError::ClashInImage {
                        image: r.image as usize,
                        path: shown(&comps[..=depth].join(&b'/')),
                        image_path: image_path(r),
                    });
                }
                return Err(BuildError::FileIsDir {
                    path: shown(&comps[..=depth].join(&b'/')),
                    file_image: image_path(file_src),
                    dir_image: image_path(r),
                });
            }
            depth += 1;
        }
        open.truncate(depth);
        for comp in &comps[depth..parents] {
            let parent = open.last().map_or(0, |o| o.0);
            nodes.push(Node {
                parent,
                name: comp,
                src: Some(r),
                is_synth: true,
            });
            open.push(((nodes.len() - 1) as u32, true));
        }
        let parent = open.last().map_or(0, |o| o.0);
        nodes.push(Node {
            parent,
            name: comps[parents],
            src: Some(r),
            is_synth: false,
        });
        open.push(((nodes.len() - 1) as u32, member(r).kind == MemberKind::Dir));
    }
    drop(winners);
    if nodes.len() >= u32::MAX as usize {
        return Err(BuildError::TooLarge("more than 4 billion entries"));
    }

    // Lay out children contiguously: groups ordered by parent, siblings already in name order.
    let n = nodes.len();
    let mut child_count = vec![0u32; n];
    for node in &nodes[1..] {
        child_count[node.parent as usize] += 1;
    }
    let mut first_child = vec![0u32; n];
    let mut cursor = 1u32;
    for (v, &count) in child_count.iter().enumerate() {
        first_child[v] = cursor;
        cursor += count;
    }
    let mut position = vec![0u32; n];
    let mut placed = vec![0u32; n];
    for (v, node) in nodes.iter().enumerate().skip(1) {
        let p = node.parent as usize;
        position[v] = first_child[p] + placed[p];
        placed[p] += 1;
    }
    drop(placed);

    // Entries in position order, and names in the same order, so the names of one directory's
    // children are contiguous too (a listing touches one stretch of the names).
    let mut node_at = vec![0u32; n];
    for (v, &pos) in position.iter().enumerate() {
        node_at[pos as usize] = v as u32;
    }
    // Each image's checkpoint tables follow the names, image after image: where they start,
    // counted from the end of the names (known once the names are laid out).
    let mut table_starts = Vec::with_capacity(images.len());
    let mut tables_len = 0u64;
    for image in images {
        table_starts.push(tables_len);
        tables_len += image.tables.as_ref().map_or(0, |t| t.len());
    }
    // Entries whose record is a table: their offsets get the names' length added at the end.
    let mut in_tables: Vec<usize> = Vec::new();
    let mut entries = Vec::with_capacity(n);
    let mut names: Vec<u8> = Vec::new();
    let mut file_count = 0u64;
    let mut file_bytes = 0u64;
    for &v in &node_at {
        let v = v as usize;
        let node = &nodes[v];
        let name_len = u16::try_from(node.name.len())
            .map_err(|_| BuildError::TooLarge("a name exceeds 64 KiB"))?;
        let mut e = Entry {
            parent: position[node.parent as usize],
            name_len,
            ..Entry::default()
        };
        e.set_name_offset(names.len() as u64)
            .ok_or(BuildError::TooLarge("names exceed 256 TiB"))?;
        names.extend_from_slice(node.name);
        if let Some(r) = node.src {
            (e.mtime, e.mtime_nsec) = (member(r).mtime, member(r).mtime_nsec);
        }
        let explicit = node.src.filter(|_| !node.is_synth).map(|r| (r, member(r)));
        match explicit {
            Some((r, m)) if m.kind == MemberKind::Symlink => {
                let target = images[r.image as usize].link_of(m);
                e.mode = S_IFLNK | 0o777;
                e.offset = names.len() as u64;
                e.size = target.len() as u64;
                names.extend_from_slice(target);
            }
            Some((r, m)) if matches!(m.kind, MemberKind::File | MemberKind::HardLink) => {
                e.mode = S_IFREG | m.mode | Entry::encoding_bits(m.encoding);
                e.size = m.size;
                e.offset = m.data_offset;
                if m.encoding == crate::archive::Encoding::Checkpointed {
                    e.offset = table_starts[r.image as usize] + m.link.start as u64;
                    in_tables.push(entries.len());
                } else if m.encoding.has_record() {
                    e.offset = names.len() as u64;
                    names.extend_from_slice(images[r.image as usize].link_of(m));
                }
                e.image = r.image;
                file_count += 1;
                file_bytes += m.size;
            }
            // An explicit directory keeps its mode; a synthesized one gets 0755.
            _ => {
                e.mode = S_IFDIR | explicit.map_or(0o755, |(_, m)| m.mode);
                e.size = child_count[v] as u64;
                e.offset = first_child[v] as u64;
            }
        }
        entries.push(e);
    }
    names.shrink_to_fit();
    let base = names.len() as u64;
    for &i in &in_tables {
        entries[i].offset += base;
    }
    // The checkpoint tables, mapped from their files after the names.
    let mut infos = Vec::with_capacity(images.len());
    let mut tail = Vec::new();
    for (i, image) in images.iter().enumerate() {
        let start = base + table_starts[i];
        if let Some(tables) = image.tables.as_ref().filter(|t| !t.is_empty()) {
            let failed = |error| BuildError::Tables {
                image: image.path.clone(),
                error,
            };
            let file = tables.file().try_clone().map_err(failed)?;
            // SAFETY: a read-only mapping of this process's own unlinked temporary file, whose
            // tables are complete and are never written again.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(failed)?;
            tail.push(Segment { start, map, file });
        }
        infos.push(ImageInfo {
            location: image.location.clone(),
            fingerprint: image.fingerprint,
            stream: image.stream.map(|table| start + table.at),
            within: image.within.map(|outer| outer as u32),
        });
    }

    Ok(Catalog {
        store: Store::Owned {
            entries,
            names,
            tail,
        },
        images: infos,
        file_count,
        file_bytes,
        skipped: super::Skipped {
            members: images.iter().map(|i| i.skipped).sum(),
            damaged_headers: images.iter().map(|i| i.damaged_headers).sum(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::Span;
    use crate::catalog::{CatalogError, Kind, ROOT};

    fn image(name: &str, members: &[(&str, MemberKind)]) -> ScannedImage {
        let location = crate::source::ImageLocation::File(PathBuf::from(name));
        let mut img = ScannedImage::new(location, Default::default());
        for (i, (path, kind)) in members.iter().enumerate() {
            let start = img.strings.len();
            img.strings.extend_from_slice(path.as_bytes());
            img.members.push(Member {
                path: Span {
                    start,
                    len: path.len(),
                },
                link: Span::default(),
                kind: *kind,
                mode: 0o644,
                mtime: 1_700_000_000,
                mtime_nsec: 0,
                size: if *kind == MemberKind::File {
                    10 + i as u64
                } else {
                    0
                },
                data_offset: 512 * (i as u64 + 1),
                header_offset: 0,
                encoding: Default::default(),
            });
        }
        img
    }

    fn names_of(cat: &Catalog, dir: u32) -> Vec<String> {
        let e = cat.entry(dir).unwrap();
        cat.children(e)
            .map(|c| String::from_utf8_lossy(cat.name(cat.entry(c).unwrap()).unwrap()).into_owned())
            .collect()
    }

    #[test]
    fn merges_shards_and_synthesizes_parents() {
        use MemberKind::*;
        let a = image(
            "a.tar",
            &[("train/cat/1.jpg", File), ("train/dog/2.jpg", File)],
        );
        let b = image(
            "b.tar",
            &[
                ("train/cat/3.jpg", File),
                ("train/cat", Dir),
                ("val/x", File),
            ],
        );
        let cat = build(&[a, b], DuplicatePolicy::Error).unwrap();
        assert_eq!(names_of(&cat, ROOT), ["train", "val"]);
        let train = cat.lookup(ROOT, b"train").unwrap();
        assert_eq!(names_of(&cat, train), ["cat", "dog"]);
        let cat_dir = cat.resolve(b"train/cat").unwrap();
        assert_eq!(names_of(&cat, cat_dir), ["1.jpg", "3.jpg"]);
        let three = cat.entry(cat.resolve(b"train/cat/3.jpg").unwrap()).unwrap();
        assert_eq!((three.kind(), three.image, three.size), (Kind::File, 1, 10));
        assert_eq!(cat.file_count(), 4);
        assert_eq!(
            cat.path_of(cat.resolve(b"train/dog/2.jpg").unwrap()),
            b"train/dog/2.jpg"
        );
        assert_eq!(cat.resolve(b"train/missing"), Err(CatalogError::NotFound));
        // Every entry's parent lists it among its children.
        for id in cat.walk(ROOT) {
            let e = cat.entry(id).unwrap();
            assert!(cat.children(cat.entry(e.parent).unwrap()).contains(&id));
        }
    }

    #[test]
    fn sibling_order_is_by_component() {
        use MemberKind::*;
        let a = image(
            "a.tar",
            &[("a b", File), ("a/x", File), ("a-c", File), ("a", Dir)],
        );
        let cat = build(&[a], DuplicatePolicy::Error).unwrap();
        assert_eq!(names_of(&cat, ROOT), ["a", "a b", "a-c"]);
        assert!(cat.lookup(ROOT, b"a-c").is_ok());
        assert_eq!(names_of(&cat, cat.lookup(ROOT, b"a").unwrap()), ["x"]);
    }

    #[test]
    fn duplicates_across_images() {
        use MemberKind::*;
        let a = || image("a.tar", &[("x/1", File), ("x", Dir)]);
        let b = || image("b.tar", &[("x/1", File), ("x", Dir)]);
        let err = build(&[a(), b()], DuplicatePolicy::Error).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("a.tar") && msg.contains("b.tar") && msg.contains("x/1"),
            "{msg}"
        );
        let cat = build(&[a(), b()], DuplicatePolicy::LastWins).unwrap();
        let one = cat.entry(cat.resolve(b"x/1").unwrap()).unwrap();
        assert_eq!(one.image, 1);
        // Within one image the later member silently wins, as when tar extracts.
        let c = image("c.tar", &[("y", File), ("y", File)]);
        let cat = build(&[c], DuplicatePolicy::Error).unwrap();
        assert_eq!(cat.entry(cat.resolve(b"y").unwrap()).unwrap().size, 11);
    }

    #[test]
    fn file_and_directory_conflict() {
        use MemberKind::*;
        let a = image("a.tar", &[("x", File)]);
        let b = image("b.tar", &[("x/1", File)]);
        let msg = build(&[a, b], DuplicatePolicy::Error)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("\"x\" is a file in a.tar but a directory in b.tar"),
            "{msg}"
        );
    }

    #[test]
    fn empty_catalog_has_a_root() {
        let cat = build(&[image("e.tar", &[])], DuplicatePolicy::Error).unwrap();
        assert_eq!(cat.len(), 1);
        assert!(cat.entry(ROOT).unwrap().is_dir());
        assert!(cat.is_empty());
    }
}
