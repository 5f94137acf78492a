//! The repository's own scripts under `.ci/`, for the tests that start, stop and fail
//! over servers with them.

use std::process::{Command, Stdio};

/// Run the project's script `.ci/<script>` with `args`; what it printed on stdout.
pub fn ci_script(script: &str, args: &[&str]) -> String {
    let path = format!("{}/.ci/{script}", env!("CARGO_MANIFEST_DIR"));
    let output = Command::new("bash")
        .arg(&path)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(output.status.success(), "{script} {args:?} failed");
    String::from_utf8(output.stdout).unwrap()
}
