//! `pack --labels EXT`: a label member beside each sample of an ImageFolder tree, as WebDataset
//! names them (`train/n01440764/x.JPEG` gets `train/n01440764/x.cls`). The class is the sample's
//! directory; its number is the directory's place among its sibling directories in name order,
//! as torchvision's ImageFolder numbers classes, so `to_tuple("jpg", "cls")` and ImageFolder
//! agree. Without it, shards of an ImageFolder tree carried the label only in the key.

use std::collections::{HashMap, HashSet};

use super::gather::{Item, ItemKind, Origin, label_text};
use crate::archive::name::key_of;

/// Splits `a/b/c` into `a/b` and `c` (`""` and `c` at the top).
fn split_last(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// The label members for `items` (directories and files as gathered): one per sample key whose
/// files lie in a class directory, unless a member of that name is already there.
pub fn members(items: &[Item], ext: &str) -> Vec<Item> {
    let mut classes: HashMap<&[u8], Vec<&[u8]>> = HashMap::new();
    for dir in items.iter().filter(|i| i.kind == ItemKind::Dir) {
        let path = dir.path.strip_suffix(b"/").unwrap_or(&dir.path);
        let (parent, name) = split_last(path);
        classes.entry(parent).or_default().push(name);
    }
    for names in classes.values_mut() {
        names.sort_unstable();
        names.dedup();
    }
    let taken: HashSet<&[u8]> = items.iter().map(|i| &*i.path).collect();
    let mut made: HashSet<Vec<u8>> = HashSet::new();
    let mut out = Vec::new();
    for file in items.iter().filter(|i| i.kind == ItemKind::File) {
        let (dir, _) = split_last(&file.path);
        if dir.is_empty() {
            continue;
        }
        let (parent, class) = split_last(dir);
        let Some(label) = classes
            .get(parent)
            .and_then(|names| names.binary_search(&class).ok())
        else {
            continue;
        };
        let mut path = key_of(&file.path).to_vec();
        path.push(b'.');
        path.extend_from_slice(ext.as_bytes());
        if taken.contains(&path[..]) || !made.insert(path.clone()) {
            continue;
        }
        let label = label as u32;
        out.push(Item {
            path: path.into(),
            link: Box::default(),
            kind: ItemKind::File,
            mode: 0o644,
            mtime: file.mtime,
            size: label_text(label).len() as u64,
            origin: Origin::Label(label),
            key_len: 0,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(path: &str, kind: ItemKind) -> Item {
        Item {
            path: path.as_bytes().into(),
            link: Box::default(),
            kind,
            mode: 0o644,
            mtime: 0,
            size: 1,
            origin: Origin::Disk(0),
            key_len: 0,
        }
    }

    #[test]
    fn classes_are_numbered_as_imagefolder_numbers_them() {
        use ItemKind::*;
        let items = [
            item("train", Dir),
            item("train/dog", Dir),
            item("train/cat", Dir),
            item("train/empty", Dir),
            item("train/dog/1.jpg", File),
            item("train/dog/1.json", File),
            item("train/cat/2.jpg", File),
            item("train/cat/3.jpg", File),
            item("train/cat/3.cls", File),
            item("top.jpg", File),
        ];
        let made: Vec<(String, u32)> = members(&items, "cls")
            .into_iter()
            .map(|i| match i.origin {
                Origin::Label(l) => (String::from_utf8(i.path.into()).unwrap(), l),
                _ => unreachable!(),
            })
            .collect();
        // cat 0, dog 1, empty 2; one per key; an existing label member is kept, not doubled;
        // a file outside any class directory gets none.
        assert_eq!(
            made,
            [
                ("train/dog/1.cls".to_string(), 1),
                ("train/cat/2.cls".to_string(), 0)
            ]
        );
    }
}
