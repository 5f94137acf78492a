//! The repository's own scripts under `.ci/`, for the tests that start, stop and fail
//! over servers with them, and its examples and the `idem` command, for the tests that
//! run them as a user does.
// Each test binary includes this file and uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The repository's root: the nearest folder above the test's crate that holds `.ci/`
/// (the facade's tests and the crates' alike include this file).
fn root() -> PathBuf {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .find(|dir| dir.join(".ci").is_dir())
        .expect("the repository holds .ci/")
        .to_path_buf()
}

/// Run the project's script `.ci/<script>` with `args`; what it printed on stdout.
pub fn ci_script(script: &str, args: &[&str]) -> String {
    let path = root().join(".ci").join(script);
    let output = Command::new("bash")
        .arg(&path)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(output.status.success(), "{script} {args:?} failed");
    String::from_utf8(output.stdout).unwrap()
}

/// The path of the example `name`, built first as the README's `cargo run --example`
/// builds it (in `CARGO_TARGET_DIR` when it is set).
pub fn example_binary(name: &str) -> String {
    let built = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--example", name])
        .current_dir(root())
        .status()
        .expect("run cargo");
    assert!(built.success(), "the example {name} builds");
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| format!("{}/target", root().display()));
    format!("{target}/debug/examples/{name}")
}

/// The path of the `idem` command (crate `idem-cli`), built first (in
/// `CARGO_TARGET_DIR` when it is set).
pub fn cli_binary() -> String {
    let built = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "-p", "idem-cli", "--bin", "idem"])
        .current_dir(root())
        .status()
        .expect("run cargo");
    assert!(built.success(), "the idem command builds");
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| format!("{}/target", root().display()));
    format!("{target}/debug/idem")
}
