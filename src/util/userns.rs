//! Whether this process runs in a user namespace (a rootless container, `unshare -Ur`,
//! Apptainer's `--userns`), where uid 0 is an ordinary user outside: root's paths (/run/packfs)
//! belong to the real root, and show as the overflow uid (65534) inside.

/// The uid of this process's uid as the initial namespace sees it, if this process is in a user
/// namespace that maps it; `None` in the initial namespace (uid_map `0 0 4294967295`).
pub fn outer_uid() -> Option<u32> {
    let map = std::fs::read_to_string("/proc/self/uid_map").ok()?;
    outer_uid_in(&map, nix::unistd::getuid().as_raw())
}

fn outer_uid_in(map: &str, uid: u32) -> Option<u32> {
    let ranges: Vec<[u64; 3]> = map
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().map(|x| x.parse::<u64>().ok());
            Some([f.next()??, f.next()??, f.next()??])
        })
        .collect();
    if ranges == [[0, 0, u32::MAX as u64]] {
        return None;
    }
    let uid = uid as u64;
    ranges
        .iter()
        .find(|[inner, _, len]| (*inner..inner + len).contains(&uid))
        .map(|[inner, outer, _]| (outer + uid - inner) as u32)
}

/// Whether this process is in a user namespace other than the initial one.
pub fn in_user_namespace() -> bool {
    outer_uid().is_some()
}

#[cfg(test)]
mod tests {
    use super::outer_uid_in;

    #[test]
    fn the_initial_namespace_and_a_rootless_one_are_told_apart() {
        assert_eq!(outer_uid_in("         0          0 4294967295\n", 0), None);
        // `unshare -Ur` as uid 1000: 0 inside is 1000 outside.
        assert_eq!(
            outer_uid_in("         0       1000          1\n", 0),
            Some(1000)
        );
        // A container's subordinate range.
        let map = "0 1000 1\n1 100000 65536\n";
        assert_eq!(outer_uid_in(map, 5), Some(100004));
        assert_eq!(outer_uid_in("garbage\n", 0), None);
    }
}
