//! The API fuzzed from its own OpenAPI document (`tests/fuzz/run.sh`, schemathesis): over a
//! thousand generated requests, no unexpected 5xx, every response as documented.

#[test]
fn the_api_survives_schemathesis() {
    if !crate::support::tool_available(
        "st",
        "the_api_survives_schemathesis",
        "pip install schemathesis",
    ) {
        return;
    }
    let out = std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fuzz/run.sh"))
        .arg(env!("CARGO_BIN_EXE_pglease"))
        .output()
        .expect("run the fuzz script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("passed"), "{stdout}");
    assert!(stdout.contains("still alive"), "{stdout}");
}
