//! Settling names that are a file in one member and a directory in another of the same image, as
//! extraction does: members are taken in archive order, and one that would need a file as its
//! parent directory, or a file that would replace a directory that already holds members, cannot
//! be extracted (GNU tar: "Not a directory", "File exists") and is left out with a warning.
//!
//! The catalog build notices for free, while it walks the sorted names, an image where a name is
//! a file in one member and a directory (or a parent) in another; only such an image pays for
//! this ordered pass.

use std::collections::HashMap;

use super::{MemberKind, ScannedImage};

/// What extraction has put at a path so far.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Placed {
    File,
    /// A directory, and whether members were put below it.
    Dir {
        has_members: bool,
    },
}

impl ScannedImage {
    /// Leaves out the members extraction could not place (see the module comment).
    pub fn drop_clashes(&mut self) {
        let mut placed: HashMap<Vec<u8>, Placed> = HashMap::new();
        let mut dropped = Vec::new();
        for i in 0..self.members.len() {
            let m = self.members[i];
            let path = self.path_of(&m).to_vec();
            let parents: Vec<usize> = (0..path.len()).filter(|&j| path[j] == b'/').collect();
            let blocked_by = parents
                .iter()
                .find(|&&j| placed.get(&path[..j]) == Some(&Placed::File));
            let why = if let Some(&j) = blocked_by {
                Some(format!(
                    "{:?}, earlier in this image, is a file, not a directory",
                    String::from_utf8_lossy(&path[..j])
                ))
            } else if m.kind != MemberKind::Dir
                && placed.get(&path) == Some(&Placed::Dir { has_members: true })
            {
                Some("a directory of that name, earlier in this image, holds members".into())
            } else {
                None
            };
            if let Some(why) = why {
                self.skip(
                    m.header_offset,
                    &path,
                    &format!("{why} (as tar extraction does)"),
                );
                dropped.push(i);
                continue;
            }
            for &j in &parents {
                placed.insert(path[..j].to_vec(), Placed::Dir { has_members: true });
            }
            let now = match m.kind {
                MemberKind::Dir => match placed.get(&path) {
                    Some(Placed::Dir { has_members }) => Placed::Dir {
                        has_members: *has_members,
                    },
                    _ => Placed::Dir { has_members: false },
                },
                _ => Placed::File,
            };
            placed.insert(path, now);
        }
        let mut index = 0;
        self.members.retain(|_| {
            let keep = dropped.binary_search(&index).is_err();
            index += 1;
            keep
        });
        self.clashes_settled = true;
    }
}
