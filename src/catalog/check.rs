//! The structure of a catalog, checked whole: for `packfs verify`. Checksums only say an index is
//! the one that was written, and anyone can write one, so this checks what the read path relies
//! on: every directory's children name it as parent and are sorted, each entry is listed by its
//! parent, names and records lie in the arena, files lie inside their images. (The read path
//! checks the same values one request at a time; this finds them all at once.)

use super::{Catalog, EntryId, Kind, ROOT};

/// Problems reported before the check stops listing them.
const MAX_PROBLEMS: usize = 20;

/// One inconsistency: the entry (its path as far as it can be read) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub entry: EntryId,
    pub path: Vec<u8>,
    pub what: String,
}

impl Catalog {
    /// Checks every entry; returns the first problems found (none for a catalog packfs built).
    pub fn check_structure(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        for id in 0..self.len() as EntryId {
            if let Err(what) = self.check_entry(id) {
                problems.push(Problem {
                    entry: id,
                    path: self.path_of(id),
                    what,
                });
                if problems.len() == MAX_PROBLEMS {
                    break;
                }
            }
        }
        problems
    }

    fn check_entry(&self, id: EntryId) -> Result<(), String> {
        let e = self.entry(id).map_err(|e| e.to_string())?;
        let name = self.name(e).map_err(|e| format!("its name: {e}"))?;
        if id == ROOT {
            if !e.is_dir() || e.parent != ROOT {
                return Err("the root is not a directory that is its own parent".into());
            }
        } else {
            if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
                return Err(format!(
                    "invalid name {}",
                    crate::archive::name::shown(name)
                ));
            }
            let parent = self
                .entry(e.parent)
                .map_err(|e| format!("its parent: {e}"))?;
            if !self.children(parent).contains(&id) || e.parent == id {
                return Err(format!(
                    "its parent, entry {}, does not list it among its children",
                    e.parent
                ));
            }
        }
        match e.kind() {
            Kind::Dir => {
                let children = self.children(e);
                if children.end as usize > self.len() || children.contains(&id) {
                    return Err(format!(
                        "its children {children:?} include itself or lie past the {} entries",
                        self.len()
                    ));
                }
                let mut previous: Option<&[u8]> = None;
                for child in children {
                    let c = self.child(id, child).map_err(|e| e.to_string())?;
                    let name = self.name(c).map_err(|e| format!("child {child}: {e}"))?;
                    if previous.is_some_and(|p| p >= name) {
                        return Err(format!("its children are not sorted at entry {child}"));
                    }
                    previous = Some(name);
                }
                Ok(())
            }
            Kind::Symlink => self
                .symlink_target(e)
                .map(|_| ())
                .map_err(|e| format!("its target: {e}")),
            Kind::File => self.placement(e).map(|_| ()).map_err(|e| e.to_string()),
        }
    }
}
