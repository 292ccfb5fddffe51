//! One slow region must not stall the mount: with reads stuck in one byte range of a shard (a
//! slow OST), reads of other files still complete. A real FUSE mount in this process, over a
//! source whose first region waits on a gate.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use packfs::catalog::DuplicatePolicy;
use packfs::fs::{Core, Owner};
use packfs::source::read_at::ReadAt;
use packfs::tiers::faults::{Fault, Faulty, Gate};
use packfs::tiers::{self, OpenedImages, TierOptions};

const FILES: u64 = 200;
/// Files read before the stall (for the baseline) and during it.
const BASELINE: std::ops::Range<u64> = 100..135;
const DURING: std::ops::Range<u64> = 135..170;
const SIZE: usize = 100_000;
const STALLED: u64 = 80;

#[test]
fn reads_stuck_in_one_region_do_not_stall_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for i in 0..FILES {
        write_file(&src.join(format!("f/{i:03}.bin")), &bytes(i, SIZE), 0o644);
    }
    let shard = dir.path().join("s.tar");
    // In name order, so that the first STALLED files are the first region of the shard.
    let names: Vec<String> = (0..FILES).map(|i| format!("f/{i:03}.bin")).collect();
    tar_members(&src, &shard, &names);
    let pattern = shard.to_string_lossy().into_owned();
    let catalog = Arc::new(
        packfs::dataset::open(
            &[pattern],
            &DuplicatePolicy::Error.into(),
            &packfs::source::Stores::default(),
            &packfs::dataset::quiet,
        )
        .unwrap(),
    );
    // The region holding the first STALLED files (tar order) waits until the gate opens.
    let stalled_end = STALLED * (SIZE as u64 + 1024);
    let gate = Arc::new(Gate::default());
    let source = OpenedImages::open(catalog.images(), &packfs::source::Stores::default())
        .unwrap()
        .wrapped(|_, data| {
            let faulty = Faulty::new(data, vec![(0..stalled_end, Fault::Stall(gate.clone()))]);
            Arc::new(faulty) as Arc<dyn ReadAt>
        });
    let files =
        tiers::assemble(Arc::new(source), &catalog, &TierOptions::direct(64 << 20)).unwrap();
    let owner = Owner { uid: 0, gid: 0 };
    let core = Arc::new(Core::new(catalog.clone(), Arc::new(files), owner));
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mut mounted = packfs::fs::mount(core, &mnt, &fs_options(), Default::default()).unwrap();

    let read = |i: u64, mnt: &Path| std::fs::read(mnt.join(format!("f/{i:03}.bin")));
    let started = Instant::now();
    for i in BASELINE {
        assert_eq!(read(i, &mnt).unwrap(), bytes(i, SIZE), "file {i}");
    }
    let baseline = started.elapsed();
    let mut stuck = Vec::new();
    for i in 0..STALLED {
        let mnt = mnt.clone();
        stuck.push(std::thread::spawn(move || read(i, &mnt)));
    }
    std::thread::sleep(Duration::from_millis(500));
    // Reads elsewhere complete while those wait (a bound, not a timing: they used to wait for the
    // gate, which opens only after this check).
    let (done, finished) = mpsc::channel();
    let healthy = {
        let mnt = mnt.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            for i in DURING {
                assert_eq!(read(i, &mnt).unwrap(), bytes(i, SIZE), "file {i}");
            }
            let _ = done.send(started.elapsed());
        })
    };
    let took = finished.recv_timeout(Duration::from_secs(30));
    let still_stuck = stuck.iter().filter(|t| !t.is_finished()).count();
    gate.open();
    for (i, t) in stuck.into_iter().enumerate() {
        assert_eq!(t.join().unwrap().unwrap(), bytes(i as u64, SIZE));
    }
    healthy.join().unwrap();
    let took = took.expect("reads outside the stalled region waited for it");
    assert!(still_stuck > 0, "the stall did not hold any read");
    // The figures for the record (not asserted: these machines are noisy).
    eprintln!(
        "{} reads of 100 kB: {:.1} ms alone, {:.1} ms while {still_stuck} reads were stalled",
        DURING.end - DURING.start,
        baseline.as_secs_f64() * 1e3,
        took.as_secs_f64() * 1e3
    );
    packfs::daemon::unmount(&mnt, false, false).unwrap();
    mounted.wait(Some(Duration::from_secs(10)));
}
