//! The README's console examples are real (and docs/json.md's): each
//! `$ command` in a ```console block (and docs/http.md's `curl` examples) runs against a fresh single node per file, and what it prints must have the
//! README's shape — the same lines, up to numbers (tokens, ports, pids,
//! timings), the host name and runs of spaces.
//!
//! Long-running commands (`palisade dev-cluster`) are not run; their own test
//! in `cli.rs` checks what they print.

use std::path::Path;
use std::process::Command;

use palisade_testkit::PalisadeNode;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_palisade"))
}

/// Each example: the command, and the lines the README shows it printing.
fn examples(readme: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut in_console = false;
    for line in readme.lines() {
        if line.trim_start().starts_with("```") {
            in_console = !in_console && line.trim() == "```console";
            continue;
        }
        if !in_console {
            continue;
        }
        match line.strip_prefix("$ ") {
            Some(cmd) => out.push((cmd.to_owned(), Vec::new())),
            None => {
                if let Some((_, printed)) = out.last_mut() {
                    printed.push(line.to_owned());
                }
            }
        }
    }
    out
}

/// Numbers become `N`, the host name `myhost`, runs of spaces one space.
fn shape(lines: &[String], host: &str) -> Vec<String> {
    let host_label = format!("{host}/pid");
    lines
        .iter()
        .map(|l| {
            let l = l.replace(&host_label, "myhost/pid");
            let mut s = String::new();
            let mut prev_digit = false;
            for c in l.chars() {
                if c.is_ascii_digit() {
                    if !prev_digit {
                        s.push('N');
                    }
                    prev_digit = true;
                } else {
                    s.push(c);
                    prev_digit = false;
                }
            }
            s.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .filter(|l| !l.is_empty())
        .collect()
}

/// Runs every console example of `file` (relative to the workspace root) in
/// order against a fresh node; returns how many ran.
fn check_examples(file: &str) -> usize {
    let text = std::fs::read_to_string(format!("{}/../../{file}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let all = examples(&text);
    assert!(!all.is_empty(), "no console examples found in {file}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("host name")
        .trim()
        .to_owned();
    let node = PalisadeNode::single(bin()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = format!(
        "{}:{}",
        bin().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for (cmd, shown) in &all {
        if cmd.contains("dev-cluster") {
            continue;
        }
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("( {cmd} ) 2>&1"))
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("PALISADE_ENDPOINTS", node.addr())
            .env_remove("PALISADE_BACKEND")
            .output()
            .unwrap();
        let printed: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(
            shape(&printed, &host),
            shape(shown, &host),
            "{file} example `{cmd}` printed:\n{}",
            printed.join("\n")
        );
        ran += 1;
    }
    ran
}

#[test]
fn every_console_example_in_the_readme_prints_what_the_readme_shows() {
    let ran = check_examples("README.md");
    assert!(ran >= 8, "only {ran} README examples ran");
}

#[test]
fn every_json_example_in_the_docs_prints_what_the_docs_show() {
    let ran = check_examples("docs/json.md");
    assert!(ran >= 5, "only {ran} JSON examples ran");
}

#[test]
fn every_curl_example_of_the_http_api_prints_what_the_docs_show() {
    let ran = check_examples("docs/http.md");
    assert!(ran >= 8, "only {ran} HTTP examples ran");
}

#[test]
fn shapes_ignore_numbers_and_spacing_but_not_words() {
    let a = shape(&["token 3   is  current".into()], "h");
    let b = shape(&["token 27 is current".into()], "h");
    assert_eq!(a, b);
    assert_ne!(a, shape(&["token 3 is stale".into()], "h"));
}
