//! The storage conformance suite against real servers: a Garage S3 node and an OpenSSH
//! SFTP server on loopback, started by `scripts/test` (see `scripts/services.sh`), which
//! exports their addresses. Without them these tests say so and pass, unless
//! `CAIRN_TEST_SERVICES=required` (as `scripts/test` sets), where a missing server fails.

use cairn_storage::testsuite;

fn address(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            assert!(
                std::env::var("CAIRN_TEST_SERVICES").as_deref() != Ok("required"),
                "{var} is not set, but the test servers are required: run the tests with scripts/test"
            );
            eprintln!("{var} is not set: skipped (run scripts/test to start the servers)");
            None
        }
    }
}

/// A fresh prefix per run, so runs never see each other's objects.
fn unique(base: &str, what: &str) -> String {
    format!(
        "{}/{what}-{:016x}",
        base.trim_end_matches('/'),
        rand::random::<u64>()
    )
}

#[test]
fn s3_on_garage_passes_the_storage_suite() {
    let Some(base) = address("CAIRN_TEST_S3") else {
        return;
    };
    let storage = cairn_storage::open(&unique(&base, "suite")).expect("open the S3 store");
    testsuite::run_all(storage.as_ref());
}

#[test]
fn sftp_on_openssh_passes_the_storage_suite() {
    let Some(base) = address("CAIRN_TEST_SFTP") else {
        return;
    };
    // `ssh` on PATH reads the test server's client config, as a user's ~/.ssh/config.
    if let Ok(bin) = std::env::var("CAIRN_TEST_SSH_BIN") {
        let path = std::env::var("PATH").unwrap_or_default();
        std::env::set_var("PATH", format!("{bin}:{path}"));
    }
    let storage = cairn_storage::open(&unique(&base, "suite")).expect("open the SFTP store");
    testsuite::run_all(storage.as_ref());
}

#[test]
fn an_unreachable_s3_endpoint_is_a_clear_error() {
    let storage =
        cairn_storage::open("s3:http://127.0.0.1:9/no-bucket/x").expect("addresses parse");
    let err = storage
        .read("config")
        .expect_err("nothing listens on port 9");
    let text = format!("{err}");
    assert!(text.contains("s3:http://127.0.0.1:9/no-bucket/x"), "{text}");
    assert!(text.contains("check the address"), "{text}");
}
