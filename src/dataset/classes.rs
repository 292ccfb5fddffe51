//! The `imagefolder` layout: flat WebDataset shards (`key.jpg`, `key.cls`, ... side by side)
//! shown as `CLASS/key.jpg`, the class read from each sample's `.cls` member (or a field of its
//! `.json` member), so unchanged `torchvision.datasets.ImageFolder` code finds the classes.
//!
//! ImageFolder numbers classes in the sorted order of their directory names; integer labels are
//! zero-padded to one width so that order is the numeric one, and label `n` is class index `n`
//! whenever every label from 0 up has a sample.

use std::collections::HashMap;

use rayon::prelude::*;
use tracing::warn;

use super::DatasetError;
use crate::archive::ScannedImage;
use crate::archive::name::{NAME_MAX, key_of};
use crate::catalog::{Catalog, Kind, ROOT};
use crate::tiers::{self, TierOptions};

/// A label member larger than this is not a label.
const MAX_LABEL: u64 = 64 * 1024;

/// Where a sample's class comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClassSource {
    /// The text of its `.cls` member.
    Cls,
    /// A field of the JSON object in its `.json` member.
    JsonField(String),
}

/// Reads every sample's label and moves its members under the class directory; the catalog
/// (built from `images` as stored) is what the labels are read through.
pub fn arrange(
    catalog: &Catalog,
    images: &mut [ScannedImage],
    source: &ClassSource,
    stores: &crate::source::Stores,
) -> Result<(), DatasetError> {
    let classes = labels(catalog, source, stores)?;
    let mut unlabeled = 0u64;
    for image in images.iter_mut() {
        for i in 0..image.members.len() {
            let m = image.members[i];
            if m.kind == crate::archive::MemberKind::Dir {
                continue;
            }
            let path = image.path_of(&m).to_vec();
            match classes.get(key_of(&path)) {
                Some(class) => {
                    let mut moved = class.clone();
                    moved.push(b'/');
                    moved.extend_from_slice(&path);
                    image.members[i].path = image.push_string(&moved);
                }
                None => unlabeled += 1,
            }
        }
    }
    if unlabeled > 0 {
        let what = match source {
            ClassSource::Cls => "a .cls member".to_string(),
            ClassSource::JsonField(f) => format!("a .json member with a {f:?} field"),
        };
        warn!(
            "{unlabeled} member(s) belong to samples without {what} that names a class: they \
             stay where they are (ImageFolder ignores files at the top)"
        );
    }
    Ok(())
}

/// Sample key -> class directory name.
fn labels(
    catalog: &Catalog,
    source: &ClassSource,
    stores: &crate::source::Stores,
) -> Result<HashMap<Vec<u8>, Vec<u8>>, DatasetError> {
    let suffix: &[u8] = match source {
        ClassSource::Cls => b".cls",
        ClassSource::JsonField(_) => b".json",
    };
    let members: Vec<(u32, Vec<u8>)> = catalog
        .walk(ROOT)
        .filter(|&id| {
            catalog.entry(id).is_ok_and(|e| {
                e.kind() == Kind::File
                    && catalog.name(e).is_ok_and(|n| n.ends_with(suffix))
                    && e.size <= MAX_LABEL
            })
        })
        .map(|id| (id, catalog.path_of(id)))
        .collect();
    if members.is_empty() {
        return Ok(HashMap::new());
    }
    let files = tiers::open(catalog, &TierOptions::direct(tiers::ONE_SHOT_CACHE), stores)
        .map_err(|e| DatasetError::Layout(e.to_string()))?;
    let read: Vec<(Vec<u8>, Option<Label>)> = members
        .into_par_iter()
        .map(|(id, path)| {
            let label = read_member(catalog, &files, id)
                .ok()
                .and_then(|bytes| parse(&bytes, source));
            (key_of(&path).to_vec(), label)
        })
        .collect();
    let width = read
        .iter()
        .filter_map(|(_, l)| match l {
            Some(Label::Number(n)) => Some(n.to_string().len()),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let mut bad = 0u64;
    let mut out = HashMap::with_capacity(read.len());
    for (key, label) in read {
        let name = match label {
            Some(Label::Number(n)) => format!("{n:0width$}").into_bytes(),
            Some(Label::Name(name)) => name,
            None => {
                bad += 1;
                continue;
            }
        };
        out.insert(key, name);
    }
    if bad > 0 {
        warn!(
            "{bad} label member(s) hold no usable class (an integer, or a name without '/' of \
             at most {NAME_MAX} bytes): their samples stay where they are"
        );
    }
    Ok(out)
}

enum Label {
    Number(u64),
    Name(Vec<u8>),
}

fn read_member(catalog: &Catalog, files: &tiers::FileReader, id: u32) -> Result<Vec<u8>, String> {
    let member = tiers::Member::of(catalog, id).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let req = tiers::ReadRequest::waiting();
    let served = files
        .read(&req, member, 0, member.size as usize, &mut buf)
        .map_err(|e| e.to_string())?;
    Ok(served.bytes().to_vec())
}

fn parse(bytes: &[u8], source: &ClassSource) -> Option<Label> {
    let text: Vec<u8> = match source {
        ClassSource::Cls => bytes.trim_ascii().to_vec(),
        ClassSource::JsonField(field) => {
            let doc: serde_json::Value = serde_json::from_slice(bytes).ok()?;
            match doc.get(field)? {
                serde_json::Value::Number(n) => n.as_u64()?.to_string().into_bytes(),
                serde_json::Value::String(s) => s.trim().as_bytes().to_vec(),
                _ => return None,
            }
        }
    };
    if !text.is_empty() && text.iter().all(u8::is_ascii_digit) && text.len() < 19 {
        return std::str::from_utf8(&text)
            .ok()?
            .parse()
            .ok()
            .map(Label::Number);
    }
    let valid = !text.is_empty()
        && text.len() <= NAME_MAX
        && text != b"."
        && text != b".."
        && !text.contains(&b'/')
        && !text.contains(&0)
        && !text.contains(&b'\n');
    valid.then_some(Label::Name(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(bytes: &[u8], source: &ClassSource) -> Option<String> {
        parse(bytes, source).map(|l| match l {
            Label::Number(n) => format!("#{n}"),
            Label::Name(n) => String::from_utf8(n).unwrap(),
        })
    }

    #[test]
    fn labels_from_cls_and_json() {
        let cls = ClassSource::Cls;
        assert_eq!(class(b"17\n", &cls).as_deref(), Some("#17"));
        assert_eq!(class(b" cat ", &cls).as_deref(), Some("cat"));
        assert_eq!(class(b"../etc", &cls), None);
        assert_eq!(class(b"", &cls), None);
        assert_eq!(class(b"..", &cls), None);
        let json = ClassSource::JsonField("label".into());
        assert_eq!(class(br#"{"label": 3}"#, &json).as_deref(), Some("#3"));
        assert_eq!(class(br#"{"label": "dog"}"#, &json).as_deref(), Some("dog"));
        assert_eq!(class(br#"{"other": 3}"#, &json), None);
        assert_eq!(class(b"not json", &json), None);
    }
}
