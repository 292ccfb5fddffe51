//! `mount.fuse.packfs`: the name mount(8) runs for `mount -t fuse.packfs SOURCE DIR -o OPTS`
//! and for fstab lines of type `fuse.packfs`. The binary answers to that name (a symlink in
//! /usr/sbin, shipped by the packages) and turns mount(8)'s calling convention into `packfs
//! mount`: `-o allow_other,stage=/dev/shm/x,cache_size=1G` becomes `--allow-other --stage
//! /dev/shm/x --cache-size 1G`; mount(8)'s own options (noauto, nofail, _netdev, x-systemd.*,
//! ...) are left to mount(8).

use std::ffi::OsString;

/// The names the helper answers to.
pub const NAMES: [&str; 2] = ["mount.fuse.packfs", "mount.packfs"];

/// Options that belong to mount(8), fstab or systemd, not to packfs. `ro` is what packfs is
/// anyway; `rw` is refused below.
fn is_generic(option: &str) -> bool {
    const GENERIC: [&str; 20] = [
        "defaults", "ro", "auto", "noauto", "user", "nouser", "users", "owner", "group", "_netdev",
        "nofail", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime",
        "relatime",
    ];
    GENERIC.contains(&option)
        // mount(8) tells a helper who mounted a `user` entry (`user=NAME`).
        || option.starts_with("user=")
        || option.starts_with("x-")
        || option.starts_with("comment=")
        || option == "sync"
        || option == "async"
}

/// What mount(8) asked, as `packfs` arguments: `mount [-v] OPTIONS SOURCE DIR`. `None` for
/// mount's `-f` (pretend).
pub fn translate(args: &[OsString]) -> Result<Option<Vec<OsString>>, String> {
    let mut positional = Vec::new();
    let mut options: Vec<String> = Vec::new();
    let mut verbose = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.to_str() {
            Some("-o") => {
                let opts = it
                    .next()
                    .ok_or("-o needs a list of options")?
                    .to_str()
                    .ok_or("mount options must be text")?;
                options.extend(opts.split(',').filter(|o| !o.is_empty()).map(String::from));
            }
            Some("-f") => return Ok(None),
            // No mtab to skip (-n), sloppy options (-s): nothing for packfs to do.
            Some("-n" | "-s") => {}
            Some("-v") => verbose = true,
            Some(flag) if flag.starts_with('-') && flag.len() > 1 => {
                return Err(format!("unknown mount flag {flag}"));
            }
            _ => positional.push(arg.clone()),
        }
    }
    let [source, dir] = <[OsString; 2]>::try_from(positional)
        .map_err(|_| "usage: mount.fuse.packfs SOURCE MOUNTPOINT [-o OPTIONS]".to_string())?;
    let mut out: Vec<OsString> = vec!["mount".into()];
    if verbose {
        out.push("-v".into());
    } else {
        // mount(8) helpers are silent on success.
        out.push("-q".into());
    }
    // An option given twice (in fstab, or in fstab and on the command line) counts once, with
    // its last value, as mount(8) takes it.
    let key_of = |o: &str| o.split_once('=').map_or(o, |(k, _)| k).replace('_', "-");
    let last: Vec<&String> = options
        .iter()
        .enumerate()
        .filter(|&(i, o)| {
            !options[i + 1..]
                .iter()
                .any(|later| key_of(later) == key_of(o))
        })
        .map(|(_, o)| o)
        .collect();
    for option in last.into_iter().filter(|o| !is_generic(o)) {
        if option == "rw" {
            return Err("packfs mounts are read-only: drop `rw` from the options".into());
        }
        let (key, value) = match option.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (option.as_str(), None),
        };
        out.push(format!("--{}", key.replace('_', "-")).into());
        out.extend(value.map(OsString::from));
    }
    out.push(source);
    out.push(dir);
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<OsString> {
        text.split(' ').map(OsString::from).collect()
    }

    #[test]
    fn fstab_options_become_packfs_flags() {
        let got = translate(&args(
            "/d/train.packfs-index /mnt/train -o ro,noauto,nofail,_netdev,x-systemd.automount,allow_other,uid=1000,stage=/dev/shm/t,cache_size=1G",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            got,
            args(
                "mount -q --allow-other --uid 1000 --stage /dev/shm/t --cache-size 1G /d/train.packfs-index /mnt/train"
            )
        );
    }

    #[test]
    fn mount_flags_are_understood_or_refused() {
        assert_eq!(translate(&args("a b -f")).unwrap(), None);
        let verbose = translate(&args("a b -n -s -v")).unwrap().unwrap();
        assert_eq!(verbose, args("mount -v a b"));
        assert!(
            translate(&args("a b -o rw"))
                .unwrap_err()
                .contains("read-only")
        );
        assert!(translate(&args("a")).unwrap_err().contains("usage"));
        // Repeated: the last one counts, as mount(8) takes it; `user=NAME` is mount(8)'s.
        let repeated = translate(&args(
            "a b -o cache_size=1G,user,allow_other,cache-size=2G,user=nobody,allow_other",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(repeated, args("mount -q --cache-size 2G --allow-other a b"));
        assert!(translate(&args("a b -x")).unwrap_err().contains("-x"));
    }
}
