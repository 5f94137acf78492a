//! The payment example's worst case through its command line, as an outside check runs
//! it: a bank that never deduplicates (`--bank-forgets-keys`), the process aborted right
//! after the evening's first charge (`--crash-after-charge`), and the same evening played
//! again (`--resume`), under each outcome policy. Without a policy the resumed evening
//! charges someone twice; with `reconcile` never; with `fail-closed` nobody twice, one
//! user's outcome unknown until `idem settle`, after which the evening replays.
//!
//! On a SQLite file always; on PostgreSQL (`IDEM_TEST_POSTGRES_URL`) and MariaDB
//! (`IDEM_TEST_MYSQL_URL`) when their URLs are set (NOT RUN without them outside CI).

#[path = "../../tests/support/ci.rs"]
mod ci;

use std::process::Command;

/// `charges=N requests=M doubled=D unknown=U`, read from the run's last line.
#[derive(Debug, PartialEq, Eq)]
struct Evening {
    charges: u64,
    requests: u64,
    doubled: u64,
    unknown: u64,
}

fn play(url: &str, args: &[&str]) -> Option<Evening> {
    let output = Command::new(ci::example_binary("payment"))
        .args(["--database-url", url, "--bank-forgets-keys"])
        .args(args)
        .output()
        .expect("run the payment example");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last()?;
    let figure = |name: &str| -> Option<u64> {
        last.split_whitespace()
            .find_map(|part| part.strip_prefix(&format!("{name}=")))?
            .parse()
            .ok()
    };
    Some(Evening {
        charges: figure("charges")?,
        requests: figure("requests")?,
        doubled: figure("doubled")?,
        unknown: figure("unknown")?,
    })
}

/// The evening under `outcome`: the crashed run (which must end by the abort, with no
/// figures), then the resumed one.
fn crash_and_resume(url: &str, outcome: &str) -> Evening {
    assert_eq!(
        play(url, &["--outcome", outcome, "--crash-after-charge"]),
        None,
        "{outcome}: the first run aborts after its first charge"
    );
    play(url, &["--outcome", outcome, "--resume"]).expect("the resumed evening prints its figures")
}

fn idem(url: &str, args: &[&str]) -> String {
    let output = Command::new(ci::cli_binary())
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .expect("run idem");
    assert!(
        output.status.success(),
        "idem {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn worst_case(url: &str, backend: &str) {
    let rerun = crash_and_resume(url, "rerun");
    assert_eq!(
        rerun.doubled, 1,
        "{backend}: without a policy the crashed user is charged twice: {rerun:?}"
    );
    assert_eq!(rerun.charges, 38);

    let reconciled = crash_and_resume(url, "reconcile");
    assert_eq!(
        reconciled,
        Evening {
            charges: 37,
            requests: 76,
            doubled: 0,
            unknown: 0
        },
        "{backend}: reconcile asks the bank and charges nobody twice"
    );

    let closed = crash_and_resume(url, "fail-closed");
    assert_eq!(
        closed,
        Evening {
            charges: 37,
            requests: 76,
            doubled: 0,
            unknown: 1
        },
        "{backend}: fail-closed charges nobody twice and leaves one outcome unknown"
    );
    // The operator: the unknown outcome, the bank's answer for its effect key, settled.
    // (A server's database may hold other evenings' records: this one is the latest.)
    let this_evening = || -> Vec<serde_json::Value> {
        let listed: serde_json::Value =
            serde_json::from_str(&idem(url, &["unknown", "--biz", "pay", "--json"])).unwrap();
        let evening = |record: &serde_json::Value| -> u64 {
            let key = record["key"].as_str().unwrap();
            key.trim_start_matches("evening")
                .split('-')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        let listed = listed.as_array().unwrap().clone();
        let latest = listed.iter().map(evening).max();
        listed
            .into_iter()
            .filter(|record| Some(evening(record)) == latest)
            .collect()
    };
    let listed = this_evening();
    assert_eq!(listed.len(), 1, "{backend}: one unsettled record: {listed:?}");
    let key = listed[0]["key"].as_str().unwrap().to_owned();
    let reference = listed[0]["effect_key"].as_str().unwrap();
    let charged = serde_json::json!({ "reference": reference, "cents": 19_900 }).to_string();
    idem(url, &["settle", "pay", &key, "charge", "--value", &charged, "--yes"]);
    assert!(
        this_evening().iter().all(|record| record["key"] != key.as_str()),
        "{backend}: settled, no longer listed"
    );
    let settled = play(url, &["--outcome", "fail-closed", "--resume"]).unwrap();
    assert_eq!(
        settled,
        Evening {
            charges: 37,
            requests: 76,
            doubled: 0,
            unknown: 0
        },
        "{backend}: once settled, the evening replays: the settled charge, no other"
    );
    println!("payment worst case on {backend}: rerun {rerun:?}; reconcile {reconciled:?}; fail-closed {closed:?}, then settled {settled:?}");
}

#[test]
fn the_worst_evening_on_sqlite() {
    let path = idem_testkit::scratch::path("payment-worst.db");
    let _ = std::fs::remove_file(&path);
    worst_case(&format!("sqlite://{}?mode=rwc", path.display()), "sqlite");
}

#[test]
fn the_worst_evening_on_postgres() {
    if let Some(url) = idem_testkit::conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") {
        worst_case(&url, "postgres");
    }
}

#[test]
fn the_worst_evening_on_mariadb() {
    if let Some(url) = idem_testkit::conformance::server_url("IDEM_TEST_MYSQL_URL", "MariaDB") {
        worst_case(&url, "mariadb");
    }
}
