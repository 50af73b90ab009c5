//! The storage conformance suite against the `rest:` backend and a real server on
//! loopback, so the REST backend keeps every promise the local, S3 and SFTP ones do.
//! The suite writes names outside the repository layout (`suite/...`), which only an
//! admin token may; what other tokens may not do is tested through the binaries
//! (`crates/cli/tests/cli/serve.rs`).

use std::net::SocketAddr;
use std::path::Path;

use cairn_server::access::{Access, Rights};
use cairn_server::{serve, ServeOptions};
use cairn_storage::{open_with, testsuite, OpenOptions};

fn start(dir: &Path) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    let options = ServeOptions::new(dir.to_path_buf(), "127.0.0.1:0".into());
    std::thread::spawn(move || {
        let result = serve(options, |addr, _| {
            let _ = tx.send(addr);
        });
        panic!("the server stopped: {result:?}");
    });
    rx.recv().expect("the server starts")
}

#[test]
fn rest_backend_passes_the_storage_suite() {
    let dir = tempfile::tempdir().unwrap();
    let mut access = Access::default();
    let token = access
        .add_token("suite", "suite", Rights::Admin, None)
        .unwrap();
    access.save(dir.path()).unwrap();
    let addr = start(dir.path());
    let storage = open_with(
        &format!("rest:http://{addr}/suite"),
        &OpenOptions {
            rest_token: Some(token),
            ca_cert: None,
        },
    )
    .expect("open the REST store");
    testsuite::run_all(storage.as_ref());
    let counts = storage
        .request_counts()
        .expect("a remote store counts requests");
    assert!(counts.put.load(std::sync::atomic::Ordering::Relaxed) > 0);
}
