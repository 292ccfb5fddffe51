//! The man pages the wheel installs (`pip install .` puts them in the venv's share/man, where
//! `man packfs` finds them with the venv active) are `packfs man`'s, committed because a
//! `pip install` builds the binary after it has gathered the wheel's files.

mod common;

use std::path::Path;

use common::*;

#[test]
fn the_wheels_man_pages_are_the_binarys() {
    let committed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/wheel-data/data/share/man/man1");
    let fresh = tempfile::tempdir().unwrap();
    run(packfs().arg("man").arg(fresh.path()));
    let names = |dir: &Path| {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    let fix =
        "run `cargo run -- man packaging/wheel-data/data/share/man/man1` and commit the pages";
    assert_eq!(names(fresh.path()), names(&committed), "{fix}");
    for name in names(fresh.path()) {
        assert!(
            std::fs::read(fresh.path().join(&name)).unwrap()
                == std::fs::read(committed.join(&name)).unwrap(),
            "{name:?} differs: {fix}"
        );
    }
}
