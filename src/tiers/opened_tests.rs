//! Tests of `opened`, kept apart so that the module stays short.

use super::*;

/// An image that cannot read at once, and counts how often it is asked what it is now.
#[derive(Default)]
struct Remote {
    stats: AtomicU64,
    /// Its mtime: changed by a test to rewrite it.
    mtime: AtomicU64,
}

impl ReadAt for Remote {
    fn read_at(&self, buf: &mut [u8], _offset: u64) -> io::Result<usize> {
        buf.fill(1);
        Ok(buf.len())
    }

    fn current(&self) -> Option<io::Result<Stamp>> {
        self.stats.fetch_add(1, Ordering::Relaxed);
        Some(Ok(Stamp {
            size: 100,
            mtime: self.mtime.load(Ordering::Relaxed) as i64,
            mtime_nsec: 0,
        }))
    }
}

/// A read that would have waited says nothing of the image: it was a stat to the parallel
/// file system for every read a FUSE ring handed to its pool.
#[test]
fn a_read_that_would_wait_does_not_stat_the_image() {
    let data = Arc::new(Remote::default());
    let source = OpenedImages::new(vec![OpenedImage {
        path: PathBuf::from("remote.tar"),
        data: data.clone(),
        size: 100,
    }]);
    let before = data.stats.load(Ordering::Relaxed);
    let mut buf = [0u8; 10];
    for _ in 0..5 {
        let err = source
            .read_exact_at(0, 0, &mut buf, Wait::Never)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }
    assert_eq!(data.stats.load(Ordering::Relaxed), before);
    source.read_exact_at(0, 0, &mut buf, Wait::May).unwrap();
    assert_eq!(buf, [1; 10]);
}

/// `count` images, each a `Remote`.
fn images(count: usize) -> (OpenedImages, Vec<Arc<Remote>>) {
    let data: Vec<Arc<Remote>> = (0..count).map(|_| Arc::new(Remote::default())).collect();
    let images = data
        .iter()
        .enumerate()
        .map(|(i, d)| OpenedImage {
            path: PathBuf::from(format!("shard-{i}.tar")),
            data: d.clone(),
            size: 100,
        })
        .collect();
    (OpenedImages::new(images), data)
}

fn stats(data: &[Arc<Remote>]) -> u64 {
    data.iter().map(|d| d.stats.load(Ordering::Relaxed)).sum()
}

/// The watcher's cost does not grow with the images: an idle mount's checks ask the storage
/// nothing, and each check asks about one image, among those read from since their last
/// check, in turn. (Checking every image every 2 s made an idle mount of 8 shards send 120
/// requests in 30 s to a MooseFS master.)
#[test]
fn checks_ask_about_one_image_read_from_and_nothing_when_idle() {
    let (source, data) = images(1024);
    let opened = stats(&data);
    let mut cursor = usize::MAX;
    for _ in 0..100 {
        assert!(!source.check_next_read(&mut cursor));
    }
    assert_eq!(stats(&data), opened, "an idle mount asked the storage");
    let mut buf = [0u8; 10];
    for image in [700, 3, 3, 512] {
        source.read_exact_at(image, 0, &mut buf, Wait::May).unwrap();
    }
    let mut checked = Vec::new();
    while source.check_next_read(&mut cursor) {
        checked.push(cursor);
    }
    assert_eq!(checked, [3, 512, 700]);
    assert_eq!(stats(&data), opened + 3);
    // Read again: checked again, from where the turn stopped.
    source.read_exact_at(3, 0, &mut buf, Wait::May).unwrap();
    source.read_exact_at(900, 0, &mut buf, Wait::May).unwrap();
    assert!(source.check_next_read(&mut cursor));
    assert_eq!(cursor, 900);
}

/// An image rewritten under the mount (its mtime changed) is found by the check after a read
/// of it, and from then on its reads fail rather than serve the new bytes.
#[test]
fn an_image_rewritten_and_read_fails_from_its_next_check_on() {
    let (source, data) = images(8);
    let mut buf = [0u8; 10];
    source.read_exact_at(5, 0, &mut buf, Wait::May).unwrap();
    data[5].mtime.store(2, Ordering::Relaxed);
    let mut cursor = usize::MAX;
    assert!(source.check_next_read(&mut cursor));
    let err = source.read_exact_at(5, 0, &mut buf, Wait::May).unwrap_err();
    assert!(err.to_string().contains("rewritten while mounted"), "{err}");
    source.read_exact_at(4, 0, &mut buf, Wait::May).unwrap();
}
