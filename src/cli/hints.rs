//! What to do next, as commands a user can copy, built from the library's typed errors: the
//! library says what happened; the command line is the CLI's to write.

use crate::daemon::MountError;
use crate::dataset::DatasetError;
use crate::dataset::expand::as_patterns;
use crate::demo::DemoError;
use crate::engine::EngineError;
use crate::pack::PackError;
use crate::source::fingerprint::show_time;
use crate::tiers::{OpenError, SameBytes, SourceError, StaleIndex};

/// The hints for `error`, one line each (none for most errors).
pub fn for_error(error: &anyhow::Error) -> Vec<String> {
    let mut hints = Vec::new();
    for cause in error.chain() {
        let (source, stale) = causes(cause);
        if let Some(SourceError::Changed {
            path,
            same_bytes: Some(SameBytes::Copied { mtime, mtime_nsec }),
            ..
        }) = source
        {
            hints.push(format!(
                "if the image was only copied, `touch -d {} {}` restores the time it was indexed \
                 with",
                show_time(*mtime, *mtime_nsec),
                shell_quoted(&path.to_string_lossy())
            ));
        }
        if let Some(stale) = stale {
            hints.push(rebuild(stale));
        }
        if !hints.is_empty() {
            break;
        }
    }
    hints
}

/// The engine's error an error is or holds (`packfs cat`, `verify`, the demo).
fn engine_error<'e>(cause: &'e (dyn std::error::Error + 'static)) -> Option<&'e EngineError> {
    cause
        .downcast_ref::<EngineError>()
        .or_else(|| match cause.downcast_ref::<DemoError>() {
            Some(DemoError::Engine(e)) => Some(e),
            _ => None,
        })
}

/// The image error and the stale index an error carries, through the wrappers that hold them.
fn causes<'e>(
    cause: &'e (dyn std::error::Error + 'static),
) -> (Option<&'e SourceError>, Option<&'e StaleIndex>) {
    let open = cause
        .downcast_ref::<OpenError>()
        .or_else(|| match cause.downcast_ref::<MountError>() {
            Some(MountError::Tiers(e)) => Some(e),
            _ => None,
        })
        .or_else(|| match cause.downcast_ref::<PackError>() {
            Some(PackError::Tiers(e)) => Some(e),
            _ => None,
        })
        .or_else(|| match engine_error(cause) {
            Some(EngineError::Tiers(e)) => Some(e),
            _ => None,
        });
    if let Some(OpenError::Source { error, stale }) = open {
        return (Some(error), stale.as_ref());
    }
    let dataset = cause
        .downcast_ref::<DatasetError>()
        .or_else(|| match cause.downcast_ref::<MountError>() {
            Some(MountError::Dataset(e)) => Some(e),
            _ => None,
        })
        .or_else(|| match engine_error(cause) {
            Some(EngineError::Dataset(e)) => Some(e),
            _ => None,
        });
    match dataset {
        Some(DatasetError::Source(e)) => (Some(e), None),
        _ => (cause.downcast_ref::<SourceError>(), None),
    }
}

/// The command that rebuilds `stale`, its images folded back into brace ranges.
fn rebuild(stale: &StaleIndex) -> String {
    let patterns: Vec<String> = as_patterns(&stale.images)
        .iter()
        .map(|p| shell_quoted(p))
        .collect();
    let command = format!(
        "packfs index{} -o {} {}",
        if stale.checksums { " --checksums" } else { "" },
        shell_quoted(&stale.index.to_string_lossy()),
        patterns.join(" ")
    );
    match stale.checksums {
        true => format!("rebuild the index with `{command}` (which keeps its checksums)"),
        false => format!(
            "rebuild the index with `{command}` (with --checksums, reads are checked against \
             the images' bytes as they are then: docs/semantics.md)"
        ),
    }
}

/// `word` as one shell word: single-quoted unless it is plain.
fn shell_quoted(word: &str) -> String {
    let plain = word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_stale_index_gets_its_rebuild_command_and_a_copy_its_touch() {
        let changed = SourceError::Changed {
            path: PathBuf::from("/d/my shard-1.tar"),
            what: "mtime was @1, is @2".into(),
            same_bytes: Some(SameBytes::Copied {
                mtime: 1_000_000_000,
                mtime_nsec: 0,
            }),
        };
        let error = OpenError::Source {
            error: changed,
            stale: Some(StaleIndex {
                index: PathBuf::from("/d/train.packfs-index"),
                images: (0..3)
                    .map(|i| PathBuf::from(format!("/d/train-{i:06}.tar")))
                    .collect(),
                checksums: true,
            }),
        };
        let text = error.to_string();
        assert!(!text.contains('`'), "the library writes no command: {text}");
        let hints = for_error(&anyhow::Error::new(MountError::Tiers(error)));
        assert_eq!(hints.len(), 2, "{hints:?}");
        assert!(
            hints[0].contains("`touch -d @1000000000.000000000 '/d/my shard-1.tar'`"),
            "{hints:?}"
        );
        assert_eq!(
            hints[1],
            "rebuild the index with `packfs index --checksums -o /d/train.packfs-index \
             '/d/train-{000000..000002}.tar'` (which keeps its checksums)"
        );
    }
}
