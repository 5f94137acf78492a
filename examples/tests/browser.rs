//! A real browser against `examples/http_payment` as the README starts it: headless
//! Chromium, driven through chromium-driver (WebDriver), double- and triple-clicks the
//! payment page's `pay` button, clicks while the first request still runs, and renders
//! the form again. Each rendered form is one charge at the bank, and every answer the
//! page shows for a form is that charge.
//!
//! Needs `chromium` and `chromium-driver` (Debian's packages; `.ci/run` installs them):
//! without them it prints `NOT RUN` and passes, except under CI.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use idem_testkit::harness::{free_port, until_listening};
use serde_json::{json, Value};

#[path = "../../tests/support/ci.rs"]
mod ci;

/// A child process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// chromium-driver, or `None` (and a line saying so) outside CI.
fn chromedriver() -> Option<String> {
    let found = ["chromedriver", "/usr/bin/chromedriver"].into_iter().find(|path| {
        Command::new(path)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the browser test: install chromium and chromium-driver"
        );
        eprintln!(
            "NOT RUN: the browser test needs chromium and chromium-driver (apt-get install chromium chromium-driver)"
        );
    }
    found.map(str::to_owned)
}

/// The example, built as the README's command builds it, listening on `port`.
fn start_example(port: u16, bank_delay_ms: u64) -> Running {
    let records = idem_testkit::scratch::path("browser.db");
    let child = Command::new(ci::example_binary("http_payment"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--database-url", &format!("sqlite://{}?mode=rwc", records.display())])
        .args(["--bank-delay-ms", &bank_delay_ms.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("start the example");
    until_listening(port, "the example");
    Running(child)
}

async fn browser(driver_port: u16) -> Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_owned(),
        json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]}),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .expect("a Chromium session")
}

async fn bank_charges(base: &str) -> u64 {
    let body: Value = reqwest::get(format!("{base}/bank/charges"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["count"].as_u64().unwrap()
}

/// Wait until the page's receipt has answered `answers` clicks; the charge ids it
/// showed, in order.
async fn shown_after(client: &Client, answers: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let receipt = client.find(Locator::Id("receipt")).await.unwrap();
        let answered: usize = receipt
            .attr("data-answered")
            .await
            .unwrap()
            .unwrap_or_default()
            .parse()
            .unwrap_or(0);
        if answered >= answers {
            let shown = receipt.attr("data-shown").await.unwrap().unwrap_or_default();
            let text = receipt.text().await.unwrap();
            assert!(text.starts_with("charge "), "the receipt shows a charge: {text}");
            return shown.split_whitespace().map(str::to_owned).collect();
        }
        assert!(
            Instant::now() < deadline,
            "the page answered {answered} of {answers} clicks"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_double_clicking_browser_pays_once_per_form() {
    let Some(driver) = chromedriver() else { return };
    let driver_port = free_port();
    let _driver = Running(
        Command::new(driver)
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver"),
    );
    until_listening(driver_port, "chromedriver");
    let port = free_port();
    // A slow bank: the second and third clicks come while the first request runs.
    let _server = start_example(port, 800);
    let base = format!("http://127.0.0.1:{port}");
    let client = browser(driver_port).await;

    // A double click, both in one tick of the page.
    client.goto(&format!("{base}/")).await.unwrap();
    client
        .execute(
            "document.getElementById('pay').click(); document.getElementById('pay').click();",
            vec![],
        )
        .await
        .unwrap();
    let first = shown_after(&client, 2).await;
    assert_eq!(bank_charges(&base).await, 1, "one charge for the double click");
    assert!(
        first.iter().all(|id| id == &first[0]),
        "every answer is the same charge: {first:?}"
    );

    // A click after it finished: the same form, the same charge, replayed.
    client.find(Locator::Id("pay")).await.unwrap().click().await.unwrap();
    let again = shown_after(&client, 3).await;
    assert_eq!(again.last(), first.first(), "{again:?}");
    assert_eq!(bank_charges(&base).await, 1);

    // A freshly rendered form is a new payment; three clicks through WebDriver, the
    // later ones while the first request runs.
    client.goto(&format!("{base}/")).await.unwrap();
    for _ in 0..3 {
        client.find(Locator::Id("pay")).await.unwrap().click().await.unwrap();
    }
    let second = shown_after(&client, 3).await;
    assert_eq!(
        bank_charges(&base).await,
        2,
        "one charge for the second form's three clicks"
    );
    assert!(second.iter().all(|id| id == &second[0]), "{second:?}");
    assert_ne!(second[0], first[0], "a new form is a new charge");

    // And one more form, one click.
    client.goto(&format!("{base}/")).await.unwrap();
    client.find(Locator::Id("pay")).await.unwrap().click().await.unwrap();
    let third = shown_after(&client, 1).await;
    assert_eq!(bank_charges(&base).await, 3);
    assert!(third[0] != first[0] && third[0] != second[0]);

    // A double click while an analytics tag refreshes its cookie between the clicks,
    // and a CSRF-like cookie appears: the same signed-in user, one charge.
    client.goto(&format!("{base}/")).await.unwrap();
    client
        .execute(
            "document.cookie = '_ga=GA1.1.' + Date.now() + '; path=/'; \
             document.getElementById('pay').click(); \
             document.cookie = '_ga=GA1.1.' + (Date.now() + 1) + '; path=/'; \
             document.cookie = 'csrf=' + Math.random() + '; path=/'; \
             document.getElementById('pay').click();",
            vec![],
        )
        .await
        .unwrap();
    let fourth = shown_after(&client, 2).await;
    assert_eq!(
        bank_charges(&base).await,
        4,
        "one charge for the double click across a cookie change"
    );
    assert!(fourth.iter().all(|id| id == &fourth[0]), "{fourth:?}");
    client.close().await.unwrap();
    eprintln!(
        "browser: 4 forms, 2 + 1 + 3 + 1 + 2 clicks answered (the last pair across a cookie change), 4 charges; \
         each form's answers one charge ({} {} {} {})",
        first[0], second[0], third[0], fourth[0]
    );
}
