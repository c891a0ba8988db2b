//! The bench in smoke mode: every step runs on tiny numbers (CI checks that it works, not how
//! fast anything is).

use std::process::Command;

#[test]
fn speed_smoke_runs_and_reports_every_column_for_shard() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let shard = std::path::Path::new(bench).with_file_name("shard");
    assert!(
        shard.exists(),
        "cargo test builds every workspace binary: {}",
        shard.display()
    );
    let out = Command::new(bench)
        .args([
            "speed",
            "--smoke",
            "--workers",
            "2",
            "--no-nginx",
            "--builtin-load",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("| shard |"))
        .unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = row.split('|').map(str::trim).collect();
    // CPU, req/s and memory are measured without optional tools.
    assert!(cols[4].parse::<f64>().is_ok(), "{row}");
    assert!(cols[5].parse::<f64>().unwrap() > 0.0, "{row}");
    assert!(cols[6].parse::<f64>().is_ok(), "{row}");
}
