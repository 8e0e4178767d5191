//! The documentation checked against the binary: the CLI reference is the binary's own help,
//! and every flag the command guide names is one the binary takes.

use std::path::Path;

use crate::common::lake_cmd;

/// `lake ARGS… --help`, as the reference prints it (no terminal: clap's default width).
fn help(args: &[&str]) -> String {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = lake_cmd(&tmp.path().join("lake")).args(args).arg("--help").output().expect("run lake");
    assert!(out.status.success(), "lake {args:?} --help: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

/// The commands a help text lists under `Commands:` (without `help`).
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|c| c != "help")
        .collect()
}

/// The reference: `lake --help`, then every command's and subcommand's.
fn reference() -> String {
    let mut out = String::from(
        "# CLI reference\n\nEvery command's `--help`, as the binary prints it. This page is generated: edit the doc comments in \
         `lake/src`, then run\n`LAKE_UPDATE_DOCS=1 cargo test -p lake --test it docs::` to write it again (a test fails while it \
         differs from the binary).\n",
    );
    let mut add = |args: &[&str]| {
        let text = help(args);
        out.push_str(&format!("\n## lake {}\n\n```text\n{}```\n", args.join(" "), text));
        text
    };
    let top = add(&[]);
    for command in commands(&top) {
        let text = add(&[&command]);
        for sub in commands(&text) {
            add(&[&command, &sub]);
        }
    }
    out.replace("## lake \n", "## lake\n")
}

#[test]
fn the_cli_reference_is_the_binarys_own_help() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/guide/cli-reference.md");
    let generated = reference();
    if std::env::var_os("LAKE_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &generated).expect("write the reference");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/guide/cli-reference.md differs from the binary's help; run `LAKE_UPDATE_DOCS=1 cargo test -p lake --test it docs::`"
    );
}

/// Every `--flag` the command guide's usage block names is one of the binary's.
#[test]
fn every_flag_the_command_guide_names_exists() {
    let guide = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/guide/cli.md")).expect("cli.md");
    let reference = reference();
    let flags = |text: &str| -> std::collections::BTreeSet<String> {
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2 && w.as_bytes()[2].is_ascii_alphabetic())
            .map(String::from)
            .collect()
    };
    let known = flags(&reference);
    let unknown: Vec<String> = flags(&guide).difference(&known).cloned().collect();
    assert!(unknown.is_empty(), "docs/guide/cli.md names flags the binary does not take: {unknown:?}");
}
