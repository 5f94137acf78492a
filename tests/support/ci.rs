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

/// Cargo, run from the repository's root with the environment of the command that ran
/// the tests: without the variables cargo sets for a test process about its own package
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_VERSION`, …). A build reads those as changed inputs
/// (a build script that reruns when `CARGO_PKG_NAME` changes, a crate that reads
/// `CARGO_PKG_VERSION`), so inherited they rebuild those crates in place, and the next
/// build from outside rebuilds them back.
fn cargo() -> Command {
    let mut command = Command::new(env!("CARGO"));
    command.current_dir(root());
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let per_package = name.starts_with("CARGO_PKG_")
            || matches!(
                name,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_MANIFEST_LINKS"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            );
        if per_package {
            command.env_remove(name);
        }
    }
    command
}

/// The path of the example `name`, built first as the README's `cargo run --example`
/// builds it (in `CARGO_TARGET_DIR` when it is set).
pub fn example_binary(name: &str) -> String {
    built(
        &["--example", name],
        &format!("examples/{name}"),
        &format!("the example {name}"),
    )
}

/// The path of the `idem` command (crate `idem-cli`), built first (in
/// `CARGO_TARGET_DIR` when it is set).
pub fn cli_binary() -> String {
    built(&["-p", "idem-cli", "--bin", "idem"], "idem", "the idem command")
}

/// `cargo build --quiet` with `what` to build, and the path of the binary it made at
/// `path` under the debug build folder; `named` says it in the failure.
fn built(what: &[&str], path: &str, named: &str) -> String {
    let status = cargo()
        .args(["build", "--quiet"])
        .args(what)
        .status()
        .expect("run cargo");
    assert!(status.success(), "{named} builds");
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| format!("{}/target", root().display()));
    format!("{target}/debug/{path}")
}
