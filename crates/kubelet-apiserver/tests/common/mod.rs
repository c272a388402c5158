//! What the single-test harnesses of this crate share (`harness = false`: the process runtime
//! starts each container's supervisor by re-running the test executable).

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// The `main` of a test executable with one test: the process runtime's shim when re-run as
/// one, else `test` on a two-thread runtime unless the command line filters it out.
pub(crate) fn run_one<F: std::future::Future<Output = ()>>(
    test: &str,
    run: impl FnOnce() -> F,
) -> ExitCode {
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        return code;
    }
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if filter.as_deref().is_some_and(|f| !test.contains(f)) {
        println!("test {test} ... filtered out");
        return ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run());
    println!("test {test} ... ok");
    ExitCode::SUCCESS
}

/// The logs of the pods' `app` containers (CRI format), all attempts.
pub(crate) fn log_text(logs: &Path) -> String {
    let mut out = String::new();
    for p in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(p.path().join("app"))
            .into_iter()
            .flatten()
            .flatten()
        {
            out.push_str(&std::fs::read_to_string(f.path()).unwrap_or_default());
        }
    }
    out
}

/// Polls `f` every 200 ms until it holds; panics naming `what` after `timeout`.
pub(crate) async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
