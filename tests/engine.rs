//! The engine as a value: built from its options and the stores it is given, read without a
//! mount, mounted in this process, and more than one of them at once. Stores are injected: a
//! `MemoryStore` and a failing store stand behind `s3://` names, through the path real stores
//! take (tests/s3.rs and tests/remote.rs run the real gateway and server).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use packfs::catalog::DuplicatePolicy;
use packfs::engine::{Engine, EngineOptions};
use packfs::fs::{Core, Owner};
use packfs::source::remote::MemoryStore;
use packfs::source::remote::faulty::{FaultyStore, Request};
use packfs::source::{ObjectStore, Stores};

const OWNER: Owner = Owner { uid: 0, gid: 0 };

/// An engine mounted in this process, unmounted when dropped (a failed assertion too leaves no
/// mount behind).
struct InProcess {
    mnt: PathBuf,
    mounted: Option<packfs::fs::Mounted>,
}

impl InProcess {
    fn mount(engine: &Engine, mnt: PathBuf) -> InProcess {
        std::fs::create_dir_all(&mnt).unwrap();
        let core = Arc::new(Core::over(engine, OWNER));
        let mounted = packfs::fs::mount(core, &mnt, &fs_options(), Default::default()).unwrap();
        InProcess {
            mnt,
            mounted: Some(mounted),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        let lazy = std::thread::panicking();
        let _ = packfs::daemon::unmount(&self.mnt, lazy, false);
        if let Some(mut mounted) = self.mounted.take() {
            mounted.wait(Some(Duration::from_secs(10)));
        }
    }
}

/// `n` files of a few KB under `stem/`, seeded by `seed`.
fn files(stem: &str, n: u64, seed: u64) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let len = 1000 + (i as usize * 997) % 9000;
            (format!("{stem}/{i:03}.bin"), bytes(seed + i, len))
        })
        .collect()
}

/// A tar of `files` in its own directory under `dir`.
fn tar(dir: &Path, stem: &str, files: &[(String, Vec<u8>)]) -> PathBuf {
    let own = dir.join(stem);
    std::fs::create_dir_all(&own).unwrap();
    tar_of(&own, stem, files).1
}

fn options(images: Vec<String>, cache_size: u64) -> EngineOptions {
    EngineOptions {
        cache_size,
        ..EngineOptions::one_shot(images, DuplicatePolicy::Error.into())
    }
}

/// Every file read through the engine, without a mount.
fn read_all(engine: &Engine, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        let mut out = Vec::new();
        packfs::fs::cat::cat(engine, name.as_bytes(), &mut out).unwrap();
        assert_eq!(&out, data, "{name}");
    }
}

/// Two engines in one process, each mounted in it at once and read from many threads: each
/// serves its own files and counts only its own reads, under its own memory budget. (The reply
/// room, the stall clock, the budget's waiters, the error log and the stores were process
/// globals: two mounts in one process shared them.)
#[test]
fn two_engines_live_in_one_process_each_with_its_own_state() {
    let dir = tempfile::tempdir().unwrap();
    let (a_files, b_files) = (files("a", 40, 1), files("b", 30, 500));
    let a_tar = tar(dir.path(), "a", &a_files);
    let b_tar = tar(dir.path(), "b", &b_files);
    let open = |tar: &Path, cache: u64| {
        let opts = options(vec![tar.display().to_string()], cache);
        Arc::new(Engine::open(&opts, Stores::default(), None, &packfs::dataset::quiet).unwrap())
    };
    let (a, b) = (open(&a_tar, 16 << 20), open(&b_tar, 32 << 20));
    a.start();
    b.start();
    let mounts = [
        InProcess::mount(&a, dir.path().join("mnt-a")),
        InProcess::mount(&b, dir.path().join("mnt-b")),
    ];
    std::thread::scope(|scope| {
        for (mnt, files) in [(&mounts[0].mnt, &a_files), (&mounts[1].mnt, &b_files)] {
            for part in 0..3 {
                scope.spawn(move || {
                    for (name, data) in files.iter().skip(part).step_by(3) {
                        assert_eq!(&std::fs::read(mnt.join(name)).unwrap(), data, "{name}");
                    }
                });
            }
        }
    });
    // Without a mount too, at the same time as the mounts live.
    read_all(&a, &a_files);
    let sizes = |f: &[(String, Vec<u8>)]| f.iter().map(|(_, d)| d.len() as u64).sum::<u64>();
    // Each engine served its own files (from its image, or its RAM tier when reads went by
    // chunks), and read its own image only: no more than twice its bytes, A read twice.
    for (engine, files, tar, times) in [(&a, &a_files, &a_tar, 2), (&b, &b_files, &b_tar, 1)] {
        let s = engine.files().images().stats();
        let len = file_len(tar);
        assert!(
            s.ram_bytes + s.source_bytes >= times * sizes(files),
            "{s:?}"
        );
        assert!((1..=2 * len).contains(&s.source_bytes), "{s:?} of {len}");
    }
    let budget = |e: &Engine| e.files().images().ram_stats().memory.total;
    assert!(budget(&a) < budget(&b), "each its own budget");
    drop(mounts);
    a.stop();
    b.stop();
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// Files by name, with their bytes.
type Files = [(String, Vec<u8>)];

/// Puts the tars of `shards` (name, files) into `store` as `s3://b/NAME.tar`.
fn stored(dir: &Path, store: &MemoryStore, shards: &[(&str, &Files)]) {
    for (stem, files) in shards {
        let tar = tar(dir, stem, files);
        store.put(&format!("s3://b/{stem}.tar"), std::fs::read(tar).unwrap());
    }
}

/// An engine reads objects from the store it is given, by the names a user gives (a glob is
/// listed in it), mounted or not; nothing reaches the network.
#[test]
fn an_engine_reads_its_objects_from_the_store_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (files("one", 20, 3), files("two", 25, 90));
    let store = Arc::new(MemoryStore::default());
    stored(dir.path(), &store, &[("train-0", &one), ("train-1", &two)]);
    let opts = options(vec!["s3://b/train-*.tar".into()], 32 << 20);
    let engine = Engine::open(
        &opts,
        Stores::given(store.clone()),
        None,
        &packfs::dataset::quiet,
    )
    .unwrap();
    assert_eq!(engine.catalog().file_count(), 45);
    assert!(engine.catalog().has_objects());
    read_all(&engine, &one);
    read_all(&engine, &two);
    assert!(
        engine.stores().stats().is_empty(),
        "no network client was made"
    );

    let mount = InProcess::mount(&engine, dir.path().join("mnt"));
    for (name, data) in two.iter().chain(&one) {
        assert_eq!(
            &std::fs::read(mount.mnt.join(name)).unwrap(),
            data,
            "{name}"
        );
    }
}

/// A store that fails: a HEAD or a LIST that fails fails the open, naming the object; a GET that
/// fails fails that read only (the next one succeeds); an object replaced since it was opened is
/// refused, never served; and waits on a slow store are counted as the readers' stall.
#[test]
fn a_failing_store_fails_what_it_touches_and_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let one = files("one", 12, 7);
    let memory = Arc::new(MemoryStore::default());
    stored(dir.path(), &memory, &[("train-0", &one)]);
    let store = FaultyStore::new(memory.clone());
    let stores = Stores::given(store.clone());
    let open = |name: &str| {
        let opts = options(vec![name.to_string()], 32 << 20);
        Engine::open(&opts, stores.clone(), None, &packfs::dataset::quiet)
    };

    store.fail_names(Request::Head, "train-0");
    let err = open("s3://b/train-0.tar").err().unwrap().to_string();
    assert!(
        err.contains("s3://b/train-0.tar") && err.contains("404"),
        "{err}"
    );
    store.heal();
    store.fail_next(Request::List, 1);
    let err = open("s3://b/train-*.tar").err().unwrap().to_string();
    assert!(err.contains("404"), "{err}");
    assert_eq!(store.requests(Request::List).1, 1);

    let engine = open("s3://b/train-*.tar").unwrap();
    store.fail_next(Request::Get, 1);
    let (first, rest) = one.split_first().unwrap();
    let mut out = Vec::new();
    let err = packfs::fs::cat::cat(&engine, first.0.as_bytes(), &mut out).unwrap_err();
    assert!(err.to_string().contains("500"), "{err}");
    read_all(&engine, &one);

    // Slow: each read waits on the store, and the wait is the mount's stall.
    store.delay(Duration::from_millis(30));
    let before = engine.files().images().stats();
    read_all(&engine, &rest[..3]);
    let after = engine.files().images().stats();
    let stalled = after.storage_stall_ns - before.storage_stall_ns;
    assert!(
        stalled >= 3 * 30_000_000,
        "stalled {stalled} ns over 3 reads"
    );
    assert!(after.storage_wait_ns - before.storage_wait_ns >= stalled);
    store.delay(Duration::ZERO);

    memory.put(
        "s3://b/train-0.tar",
        std::fs::read(tar(dir.path(), "again", &files("one", 12, 8))).unwrap(),
    );
    let err = packfs::fs::cat::cat(&engine, rest[5].0.as_bytes(), &mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("replaced"), "{err}");
    let (gets, failed) = store.requests(Request::Get);
    assert!(gets > 12 && failed == 1, "{gets} GETs, {failed} failed");
    // The trait object a caller passes is the store the engine holds.
    let held: Arc<dyn ObjectStore> = engine.stores().object_store();
    assert!(Arc::ptr_eq(&held, &(store.clone() as Arc<dyn ObjectStore>)));
}
