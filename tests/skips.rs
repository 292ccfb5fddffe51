//! A test that cannot run for want of a tool or package fails, saying what is missing and how to
//! get it, unless PACKFS_ALLOW_SKIP names the requirement: a skip reads `ok` in `cargo test`'s
//! summary, so two webdataset tests once passed unseen on a fresh machine. (One test in its own
//! binary: it sets the environment variable the helper reads.)

mod common;

use common::skip;

#[test]
fn a_skip_fails_unless_allowed_by_name() {
    let attempt = || std::panic::catch_unwind(|| skip("python:nosuchmodule", "it is missing"));
    // SAFETY: the only test of this binary: no other thread reads the environment meanwhile.
    unsafe { std::env::remove_var("PACKFS_ALLOW_SKIP") };
    let failed = attempt().expect_err("a skip nobody allowed must fail");
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("it is missing")
            && message.contains("PACKFS_ALLOW_SKIP=python:nosuchmodule"),
        "{message}"
    );
    for allowed in ["python:nosuchmodule", "uring,python:nosuchmodule", "all"] {
        // SAFETY: as above.
        unsafe { std::env::set_var("PACKFS_ALLOW_SKIP", allowed) };
        assert!(attempt().is_ok(), "PACKFS_ALLOW_SKIP={allowed}");
    }
    // SAFETY: as above.
    unsafe { std::env::set_var("PACKFS_ALLOW_SKIP", "uring") };
    assert!(
        attempt().is_err(),
        "another requirement allowed is not this one"
    );
}
