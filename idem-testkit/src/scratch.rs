//! Where tests put the files they make: SQLite databases, logs, a worker's folder.
//!
//! Each test process gets a folder of its own, `idem-scratch/<pid>` under the system
//! temp dir, and [`path`] names a file in it. Libtest never drops statics, so no process
//! can remove its own folder as it exits; instead the first call of each process removes
//! the folders of the processes that have ended. A run leaves behind only the folders of
//! its last few processes, and the next run removes those: the temp dir does not fill
//! up run after run with databases nobody reads again.
//!
//! ```
//! let database = idem_testkit::scratch::path("orders.db");
//! let url = format!("sqlite://{}", database.display());
//! # assert!(url.contains("idem-scratch"));
//! ```

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

/// The folder that holds every test process's folder.
fn root() -> PathBuf {
    std::env::temp_dir().join("idem-scratch")
}

/// `name` in this process's scratch folder, made on first use (and the folders of the
/// processes that have ended removed then). The file itself is not made.
pub fn path(name: &str) -> PathBuf {
    folder().join(name)
}

/// This process's scratch folder.
pub fn folder() -> &'static Path {
    static FOLDER: OnceLock<PathBuf> = OnceLock::new();
    FOLDER.get_or_init(|| {
        let root = root();
        sweep(&root);
        let own = root.join(std::process::id().to_string());
        std::fs::create_dir_all(&own)
            .unwrap_or_else(|error| panic!("cannot make the scratch folder {}: {error}", own.display()));
        own
    })
}

/// Remove the folders of processes that have ended. Another process sweeping at the
/// same time, or a file still open elsewhere, only leaves a folder for a later sweep.
fn sweep(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && ended(pid, &entry.path()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Whether the process that made `folder` has ended: on Linux, no `/proc/<pid>`;
/// elsewhere, the folder has not been written for a day.
fn ended(pid: u32, folder: &Path) -> bool {
    let proc = Path::new("/proc");
    if proc.join("self").exists() {
        return !proc.join(pid.to_string()).exists();
    }
    let day = Duration::from_secs(24 * 60 * 60);
    std::fs::metadata(folder)
        .and_then(|meta| meta.modified())
        .map(|modified| SystemTime::now().duration_since(modified).unwrap_or_default() > day)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_process_folder_is_swept_and_a_running_one_kept() {
        let root = std::env::temp_dir().join(format!("idem-scratch-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // A process that has ended: a child that ran and was waited for.
        let child = std::process::Command::new("true").spawn().unwrap();
        let ended_pid = child.id();
        let mut child = child;
        child.wait().unwrap();
        let gone = root.join(ended_pid.to_string());
        let running = root.join(std::process::id().to_string());
        let other = root.join("not-a-pid");
        for folder in [&gone, &running, &other] {
            std::fs::create_dir_all(folder).unwrap();
            std::fs::write(folder.join("records.db"), b"x").unwrap();
        }
        sweep(&root);
        assert!(!gone.exists(), "the ended process's folder stays");
        assert!(
            running.join("records.db").exists(),
            "a running process's folder was removed"
        );
        assert!(other.exists(), "a folder not named by a process was removed");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn names_are_in_this_process_folder() {
        let file = path("a.db");
        assert_eq!(file.parent().unwrap(), folder());
        assert!(folder().is_dir());
        assert!(folder().ends_with(std::process::id().to_string()));
    }
}
