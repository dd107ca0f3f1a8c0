//! The binary: `check-config`, and `serve` exiting 0 on SIGTERM.

use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_residue");

#[test]
fn check_config_reports_every_problem_and_fails() {
    let path = std::env::temp_dir().join(format!("residue-test-{}-bad.toml", std::process::id()));
    std::fs::write(
        &path,
        "[server]\nlisen = 1\n[upstream]\nurl = \"ftp://x\"\nconnect-timeout = \"soon\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "server.lisen: unknown field",
        "upstream.connect-timeout",
        "upstream.url",
    ] {
        assert!(err.contains(needle), "{needle} missing from:\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/residue.example.toml");
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(example)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(path);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn serve_exits_zero_on_sigterm() {
    if !crate::support::require_tool("the kill command", "kill", &["-l"]) {
        return;
    }
    let (port, admin) = (free_port(), free_port());
    let mut child = Command::new(BIN)
        .args(["serve", "--upstream", "http://127.0.0.1:9"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .args(["--incidents", "-"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", admin)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "residue did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "residue did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
